"""Time qdrant-edge sparse-vector BM25 (weights computed by us, no modifier) at N memories in one
scope beside N over 1,000 scopes, and how much of the exact top k it finds.

A memory's vector: term id (stable 32-bit hash) -> tf(k1+1)/(tf + k1(1 - b + b·dl/avgdl)), with
avgdl the scope's at load time. A query's: term id -> idf from the scope's statistics. That
scores exact BM25 as long as avgdl holds. Queries: 200 LoCoMo dev questions; limit K (the
service's search depth). Usage: python docs/research/probes/sparse_probe.py [N] (repo root, idle).
"""
import hashlib
import random
import shutil
import sys
import time
from collections import Counter
from math import log

import numpy as np
import qdrant_edge as q

sys.path.insert(0, ".")
from bench import locomo_data  # noqa: E402
from engram.domain.text import bm25_terms  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
K1, B, K = 1.2, 0.75, 100
P = "/tmp/research22/sparse"
shutil.rmtree(P, ignore_errors=True)


def tid(term: str) -> int:
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "little")


convs = locomo_data.load()[0]
turns = [t.text for c in convs for t in c.turns]
analysed = [bm25_terms(t) for t in turns]
docs = {}  # scope -> list of (point id, Counter, length)
for i in range(2 * N):
    user = "big" if i < N else f"small-{i % 1000}"
    terms = analysed[i % len(turns)] + [f"tail{i}"]
    docs.setdefault(user, []).append((i + 1, Counter(terms), len(terms)))
stats = {}
for user, rows in docs.items():
    df = Counter()
    for _, tf, _ in rows:
        df.update(tf.keys())
    stats[user] = (len(rows), sum(r[2] for r in rows) / len(rows), df)

s = q.EdgeShard.create(P, q.EdgeConfig(vectors={}, sparse_vectors={"bm25": q.EdgeSparseVectorParams()}))
s.update(q.UpdateOperation.create_field_index("user_id", q.KeywordIndexParams(is_tenant=True)))
t0 = time.perf_counter()
batch = []
for user, rows in docs.items():
    n, avgdl, _ = stats[user]
    for pid, tf, dl in rows:
        ids = [tid(t) for t in tf]
        vals = [c * (K1 + 1) / (c + K1 * (1 - B + B * dl / avgdl)) for c in tf.values()]
        batch.append(q.Point(pid, {"bm25": q.SparseVector(indices=ids, values=vals)}, {"user_id": user}))
        if len(batch) == 2_000:
            s.update(q.UpdateOperation.upsert_points(batch))
            batch = []
s.update(q.UpdateOperation.upsert_points(batch))
print(f"loaded {2 * N} points in {time.perf_counter() - t0:.1f} s", flush=True)
questions = [qq.question for c in convs for qq in c.questions]
queries = random.Random(7).sample(questions, 200)


def exact_top(user: str, terms: list[str]) -> list[float]:
    n, avgdl, df = stats[user]
    idf = {t: log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in set(terms) if df[t]}
    scores = Counter()
    for pid, tf, dl in docs[user]:
        for t, w in idf.items():
            if t in tf:
                scores[pid] += w * tf[t] * (K1 + 1) / (tf[t] + K1 * (1 - B + B * dl / avgdl))
    return [score for _, score in scores.most_common(K)]


def measure(label: str) -> None:
  for user in ("big", "small-7"):
    n, avgdl, df = stats[user]
    flt = q.Filter(must=[q.FieldCondition("user_id", match=q.MatchValue(user))])
    lat, overlap = [], []
    for text in queries:
        terms = sorted(set(bm25_terms(text)))
        idf = {t: log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms if df[t]}
        if not idf:
            continue
        vec = q.SparseVector(indices=[tid(t) for t in idf], values=list(idf.values()))
        t = time.perf_counter()
        hits = s.query(q.QueryRequest(limit=K, query=q.Query.Nearest(vec, using="bm25"), filter=flt))
        lat.append((time.perf_counter() - t) * 1000)
        want = exact_top(user, terms)  # scores: many memories tie (a turn recurs with another tail)
        got = sorted((h.score for h in hits), reverse=True)
        overlap.append(len(got) == len(want) and all(abs(a - b) <= 1e-4 * max(1.0, b) for a, b in zip(got, want)))
    print(f"{label:12s} {user:8s} sparse p50 {np.percentile(lat, 50):6.2f} ms  p95 {np.percentile(lat, 95):6.2f} ms"
          f"  p99 {np.percentile(lat, 99):6.2f}  queries whose top-{K} scores equal the exact ones: {sum(overlap)} of {len(overlap)}", flush=True)
measure("unoptimised")
t0 = time.perf_counter()
s.optimize()
print(f"optimize {time.perf_counter() - t0:.1f} s", flush=True)
measure("optimised")
s.close()
