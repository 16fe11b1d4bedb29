"""Time qdrant-edge BM25 (TextQuery + per-scope IDF corpus) at 100k memories in one scope, beside
1,000 scopes of 100 in the same shard. Terms: LoCoMo dev turns through our analyzer, each with a
unique tail. Usage: python scale_probe.py [memories] (run from the repo root, nothing else running)."""
import shutil, sys, time, itertools, random
import numpy as np
import qdrant_edge as q
sys.path.insert(0, ".")
from bench import locomo_data
from engram.domain.text import bm25_terms

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
P = "/tmp/research22/scale"; shutil.rmtree(P, ignore_errors=True)
turns = [t.text for conv in locomo_data.load()[0] for t in conv.turns]
analysed = [bm25_terms(t) for t in turns]
s = q.EdgeShard.create(P, q.EdgeConfig(vectors={"d": q.EdgeVectorParams(size=4, distance=q.Distance.Cosine)}))
s.update(q.UpdateOperation.create_field_index("user_id", q.KeywordIndexParams(is_tenant=True)))
s.update(q.UpdateOperation.create_field_index("deleted", q.PayloadSchemaType.Integer))
s.update(q.UpdateOperation.create_field_index("terms", q.TextIndexParams(tokenizer=q.TokenizerType.Whitespace, lowercase=False, scoring=True)))
t0 = time.perf_counter()
for start in range(0, 2 * N, 2_000):
    pts = []
    for i in range(start, min(start + 2_000, 2 * N)):
        user = "big" if i < N else f"small-{i % 1000}"
        terms = analysed[i % len(analysed)] + [f"tok{i}"]
        pts.append(q.Point(i + 1, {"d": [1.0, (i % 7) / 7, (i % 11) / 11, 0.5]}, {"user_id": user, "deleted": int(i % 50 == 0), "terms": " ".join(terms)}))
    s.update(q.UpdateOperation.upsert_points(pts))
print(f"loaded {2 * N} points in {time.perf_counter() - t0:.1f} s", flush=True)
t0 = time.perf_counter(); s.optimize(); print(f"optimize {time.perf_counter() - t0:.1f} s", flush=True)
queries = [" ".join(bm25_terms(t)) for t in random.Random(7).sample(turns, 200)]
def scope(user):
    return q.Filter(must=[q.FieldCondition("user_id", match=q.MatchValue(user)), q.FieldCondition("deleted", match=q.MatchValue(0))])
for user in ("big", "small-7"):
    f = scope(user)
    for label, params in (("corpus idf", q.SearchParams(idf=q.IdfParams(corpus=f))), ("global idf", None)):
        lat = []
        for text in queries:
            t = time.perf_counter()
            s.query(q.QueryRequest(limit=50, query=q.TextQuery("terms", text, q.Bm25Params(k=1.2, b=0.75)), filter=f, params=params))
            lat.append((time.perf_counter() - t) * 1000)
        print(f"{user:8s} {label:10s} p50 {np.percentile(lat, 50):6.2f} ms  p95 {np.percentile(lat, 95):6.2f} ms  p99 {np.percentile(lat, 99):6.2f}", flush=True)
s.close()
