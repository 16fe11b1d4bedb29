"""Documents embedded one per model run against in runs of 16: quality and cost (no service).

bge-small-en-v1.5's int8 file quantizes a run's activations with one scale and zero point, so a
text run beside others gets a vector that depends on them. This measures what that does on
LoCoMo dev, with the service's default model and threads, in this process:

- quality: the dense leg alone (cosine over the conversation's turns, every question of
  categories 1-4 embedded as the service embeds a query), R@10 / nDCG@10 of the evidence,
  with each turn embedded alone and in runs of 16 under several compositions: the turns
  handed to the embedder in one call, per conversation, or in calls of 64 or 200 consecutive
  turns (in turn order or shuffled), as the ingest pipeline's batches might hand them;
- how far a turn's vectors are apart, alone and in runs of 16 (one call);
- cost: CPU ms per text and texts a second, embedding on the pool's 2 threads as an import
  does, for the LoCoMo turns and for texts of 4 turns joined; the modes interleaved, in
  `--rounds` rounds (default 3).

"Runs of 16" is what Embedder.embed_sync did before: each call's texts sorted by token count,
16 per run, padded to the longest, mean or CLS pooling over the real tokens.

    .venv/bin/python -m bench.embedding_runs     # -> bench/reports/embedding-runs.md
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from bench import common, locomo_data
from engram.inference.embedder import Embedder, model_files
from engram.settings import Settings

RUN = 16  # texts per run in the batched mode (the old Embedder.BATCH)
CATEGORIES = {1, 2, 3, 4}


def in_runs(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """The old embed_sync, one call: runs of RUN texts of similar length, on the embedder's pool."""
    encodings = embedder._tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    runs = [order[start:start + RUN] for start in range(0, len(order), RUN)]

    def one_run(rows: list[int]) -> np.ndarray:
        width = max(len(encodings[i].ids) for i in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, i in enumerate(rows):
            ids[row, :len(encodings[i].ids)] = encodings[i].ids
            mask[row, :len(encodings[i].ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in embedder._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = embedder._session.run(None, feeds)[0]
        if embedder.files.pooling == "cls":
            vectors = hidden[:, 0]
        else:
            vectors = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    for rows, vectors in zip(runs, embedder._runs.map(one_run, runs)):
        out[rows] = vectors
    return out


ALONE, IN_RUNS = "one text per run (now)", f"runs of {RUN} (before)"
MODES = {ALONE: lambda e, texts: e.embed_sync(texts), IN_RUNS: in_runs}


def compositions(embedder: Embedder, conversations) -> dict[str, np.ndarray]:
    """Every turn's vector (in turn order) alone and in runs of RUN under several ways of
    handing the turns to the embedder."""
    turns = [t.text for conv in conversations for t in conv.turns]

    def in_calls(order: list[int], size: int) -> np.ndarray:
        out = np.empty((len(turns), embedder.dim), dtype=np.float32)
        for first in range(0, len(order), size):
            rows = order[first:first + size]
            out[rows] = in_runs(embedder, [turns[i] for i in rows])
        return out

    per_conversation, first = np.empty((len(turns), embedder.dim), dtype=np.float32), 0
    for conv in conversations:
        per_conversation[first:first + len(conv.turns)] = in_runs(embedder, [t.text for t in conv.turns])
        first += len(conv.turns)
    in_order = list(range(len(turns)))
    out = {ALONE: embedder.embed_sync(turns), f"{IN_RUNS}, one call": in_runs(embedder, turns),
           f"{IN_RUNS}, a call per conversation": per_conversation,
           f"{IN_RUNS}, calls of 64 turns in turn order": in_calls(in_order, 64),
           f"{IN_RUNS}, calls of 200 turns in turn order": in_calls(in_order, 200)}
    for seed in (1, 2, 3):
        shuffled = random.Random(seed).sample(in_order, len(in_order))
        out[f"{IN_RUNS}, calls of 64 shuffled turns (seed {seed})"] = in_calls(shuffled, 64)
    return out


def dense_quality(conversations, vectors: np.ndarray, questions: dict[tuple[str, int], np.ndarray]) -> dict:
    """Mean R@5 / R@10 / nDCG@10 / Hit@10 when each question ranks its conversation's turns
    (`vectors`, in turn order) by cosine alone."""
    rows, first = [], 0
    for conv in conversations:
        ids = [t.dia_id for t in conv.turns]
        mine = vectors[first:first + len(ids)]
        first += len(ids)
        for q in conv.questions:
            if q.category in CATEGORIES:
                order = np.argsort(-(mine @ questions[(q.sample_id, q.index)]), kind="stable")
                rows.append(locomo_data.score([ids[i] for i in order], q.evidence))
    return locomo_data.mean_scores(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    started = time.time()
    conversations, _ = locomo_data.load()
    model = Settings.model_fields["embedding_model"].default
    embedder = Embedder.open(model_files(model), threads=Settings.model_fields["embedding_threads"].default)
    turns = [t.text for conv in conversations for t in conv.turns]
    rng = random.Random(1)
    joined = [" ".join(rng.sample(turns, 4)) for _ in range(600)]
    questions = {(q.sample_id, q.index): embedder.embed_sync([embedder.files.query_prefix + q.question],
                                                             parallel=False)[0]
                 for conv in conversations for q in conv.questions if q.category in CATEGORIES}
    vectors = compositions(embedder, conversations)
    quality = {mode: dense_quality(conversations, v, questions) for mode, v in vectors.items()}
    batched = [q["R@10"] for mode, q in quality.items() if mode != ALONE]
    cosine = (vectors[ALONE] * vectors[f"{IN_RUNS}, one call"]).sum(axis=1)

    cost: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds):
        for corpus, texts in (("LoCoMo turns", turns), ("4 turns joined", joined)):
            modes = list(MODES.items()) if round_ % 2 == 0 else list(MODES.items())[::-1]
            for mode, fn in modes:
                cpu, wall = time.process_time(), time.perf_counter()
                fn(embedder, texts)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                cost.setdefault((corpus, mode), []).append((cpu / len(texts) * 1e3, len(texts) / wall))
                print(f"  {round_} {corpus} {mode}: {len(texts) / wall:.0f} texts/s", flush=True)

    tokens = {corpus: np.mean([embedder.count_tokens(t) for t in texts])
              for corpus, texts in (("LoCoMo turns", turns), ("4 turns joined", joined))}
    body = [
        f"{model} int8, {len(turns)} LoCoMo dev turns, {len(questions)} questions (categories 1-4), "
        "in this process, no service running. See the module docstring for the method.",
        "",
        "## Quality of the dense leg alone",
        "",
        common.md_table(["documents embedded", "R@5", "R@10", "nDCG@10", "Hit@10"],
                        [[mode, *(f"{q[m]:.4f}" for m in ("R@5", "R@10", "nDCG@10", "Hit@10"))]
                         for mode, q in quality.items()]),
        "",
        f"In runs of {RUN}, R@10 ranged {min(batched):.4f}-{max(batched):.4f} (mean {np.mean(batched):.4f}) with how "
        "the turns were handed over; "
        f"alone it is {quality[ALONE]['R@10']:.4f} whatever the order. A turn's vectors alone and in runs of {RUN} "
        f"(one call): cosine mean {cosine.mean():.5f}, 5th percentile {np.percentile(cosine, 5):.5f}, "
        f"min {cosine.min():.5f}. Queries are embedded alone throughout.",
        "",
        "## Cost, on the embedder's 2 pool threads",
        "",
        common.md_table(["texts", "tokens per text", "documents embedded", "CPU ms per text", "texts/s"],
                        [[corpus, f"{tokens[corpus]:.0f}", mode, f"{np.mean([c for c, _ in v]):.2f}",
                          f"{np.mean([r for _, r in v]):.1f}"] for (corpus, mode), v in cost.items()]),
        "",
        f"Each figure is the mean of {args.rounds} interleaved rounds.",
    ]
    path = common.write_report("embedding-runs", "Embedding documents one per model run against in runs of 16",
                               "\n".join(body), started=started)
    print(path)


if __name__ == "__main__":
    main()
