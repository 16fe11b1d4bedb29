"""Documents embedded one per model run against in runs of 16: quality and cost (no service).

The int8 embedding model quantizes a run's activations with one scale, set by the largest of
them, so a text run beside others gets a vector that depends on them. This measures what that
costs on LoCoMo dev, with the service's default model and threads, in this process:

- quality: the dense leg alone (cosine over the conversation's turns, every question of
  categories 1-4 embedded as the service embeds a query), R@10 / nDCG@10 of the evidence;
- how far the two modes' vectors are apart (cosine between a turn's two vectors);
- cost: CPU ms per text and texts a second, embedding on the pool's 2 threads as an import
  does, for the LoCoMo turns and for texts of 4 turns joined; the modes interleaved, in
  `--rounds` rounds (default 3).

"Runs of 16" is what Embedder.embed_sync did before: texts sorted by token count, 16 per run,
padded to the longest, mean or CLS pooling over the real tokens.

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
    """The old embed_sync: runs of RUN texts of similar length, on the embedder's pool."""
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


MODES = {"one text per run (now)": lambda e, texts: e.embed_sync(texts), f"runs of {RUN} (before)": in_runs}


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
    vectors = {mode: fn(embedder, turns) for mode, fn in MODES.items()}
    quality = {mode: dense_quality(conversations, v, questions) for mode, v in vectors.items()}
    alone, runs = (vectors[mode] for mode in MODES)  # the order MODES names them in
    cosine = (alone * runs).sum(axis=1)

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
        f"A turn's two vectors: cosine mean {cosine.mean():.5f}, 5th percentile {np.percentile(cosine, 5):.5f}, "
        f"min {cosine.min():.5f}. Queries are embedded alone in both modes.",
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
