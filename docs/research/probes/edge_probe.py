import math, shutil, zlib
import qdrant_edge as q
P = "/tmp/research22/shard"; shutil.rmtree(P, ignore_errors=True)
K1, B = 1.2, 0.75
docs = {  # id: (user, deleted, terms)
 1: ("a", 0, "alic adopt golden retriev max".split()),
 2: ("a", 0, "alic like coffe coffe".split()),
 3: ("a", 0, "bob golden gate bridg visit trip long long long".split()),
 4: ("a", 1, "golden golden golden".split()),          # deleted
 5: ("b", 0, "golden retriev".split()),
 6: ("b", 0, "golden".split()),
 7: ("b", 0, "unrel text".split()),
}
tid = lambda t: zlib.crc32(t.encode()) & 0x7fffffff
live = lambda u: [i for i,(uu,d,_) in docs.items() if uu==u and not d]
def avgdl(u): return sum(len(docs[i][2]) for i in live(u))/len(live(u))
def sat(tf, dl, avg): return tf*(K1+1)/(tf+K1*(1-B+B*dl/avg))
cfg = q.EdgeConfig(vectors={"d": q.EdgeVectorParams(size=2, distance=q.Distance.Cosine)},
                   sparse_vectors={"bm25": q.EdgeSparseVectorParams(modifier=q.Modifier.Idf)})
s = q.EdgeShard.create(P, cfg)
s.update(q.UpdateOperation.create_field_index("user_id", q.KeywordIndexParams(is_tenant=True)))
s.update(q.UpdateOperation.create_field_index("deleted", q.PayloadSchemaType.Integer))
s.update(q.UpdateOperation.create_field_index("terms", q.TextIndexParams(
    tokenizer=q.TokenizerType.Whitespace, lowercase=False, scoring=True)))
pts = []
for i,(u,d,ts) in docs.items():
    a = avgdl(u); tf = {}
    for t in ts: tf[t] = tf.get(t,0)+1
    sv = q.SparseVector([tid(t) for t in tf], [sat(c, len(ts), a) for c in tf.values()])
    pts.append(q.Point(i, {"d": [1.0, i/10], "bm25": sv}, {"user_id": u, "deleted": d, "terms": " ".join(ts)}))
s.update(q.UpdateOperation.upsert_points(pts))
scope = q.Filter(must=[q.FieldCondition("user_id", match=q.MatchValue("a")), q.FieldCondition("deleted", match=q.MatchValue(0))])
query = ["golden", "retriev"]
def expected(u):
    ids = live(u); N = len(ids); a = avgdl(u); out = {}
    for i in ids:
        ts = docs[i][2]; sc = 0
        for t in query:
            if t in ts:
                df = sum(1 for j in ids if t in docs[j][2])
                sc += math.log(1+(N-df+0.5)/(df+0.5))*sat(ts.count(t), len(ts), a)
        if sc: out[i] = round(sc,4)
    return out
print("expected per-scope BM25 (scope a, live):", expected("a"))
sq = q.SparseVector([tid(t) for t in query], [1.0]*len(query))
for label, params in [("sparse, idf global", None), ("sparse, idf corpus=scope", q.SearchParams(idf=q.IdfParams(corpus=scope)))]:
    r = s.query(q.QueryRequest(limit=10, query=q.Query.Nearest(sq, using="bm25"), filter=scope, params=params))
    print(label, {p.id: round(p.score,4) for p in r})
for label, params in [("text, idf global", None), ("text, idf corpus=scope", q.SearchParams(idf=q.IdfParams(corpus=scope)))]:
    try:
        r = s.query(q.QueryRequest(limit=10, query=q.TextQuery("terms", " ".join(query), q.Bm25Params(k=K1, b=B)), filter=scope, params=params))
        print(label, {p.id: round(p.score,4) for p in r})
    except Exception as e: print(label, "ERROR", e)
r = s.query(q.QueryRequest(limit=10, prefetches=[
        q.Prefetch(limit=10, query=q.Query.Nearest([1.0, 0.0], using="d"), filter=scope),
        q.Prefetch(limit=10, query=q.Query.Nearest(sq, using="bm25"), filter=scope, params=q.SearchParams(idf=q.IdfParams(corpus=scope)))],
    query=q.Fusion.Rrf(k=60)))
print("rrf dense+sparse", [(p.id, round(p.score,4)) for p in r])
# delete/recover: flip deleted on 1, change content of 2
s.update(q.UpdateOperation.set_payload([1], {"deleted": 1}))
r = s.query(q.QueryRequest(limit=10, query=q.Query.Nearest(sq, using="bm25"), filter=scope, params=q.SearchParams(idf=q.IdfParams(corpus=scope))))
print("after soft-delete of 1, sparse corpus", {p.id: round(p.score,4) for p in r})
r = s.query(q.QueryRequest(limit=10, query=q.TextQuery("terms", " ".join(query), q.Bm25Params(k=K1, b=B)), filter=scope, params=q.SearchParams(idf=q.IdfParams(corpus=scope))))
print("after soft-delete of 1, text corpus", {p.id: round(p.score,4) for p in r})
s.close()
