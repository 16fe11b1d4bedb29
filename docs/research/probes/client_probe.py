from qdrant_client import QdrantClient, models as m
c = QdrantClient(location=":memory:")
c.create_collection("t", vectors_config={"d": m.VectorParams(size=2, distance=m.Distance.COSINE)},
    sparse_vectors_config={"bm25": m.SparseVectorParams(modifier=m.Modifier.IDF)})
c.create_payload_index("t", "terms", m.TextIndexParams(type=m.TextIndexType.TEXT, tokenizer=m.TokenizerType.WHITESPACE, lowercase=False, scoring=True))
docs = {1: ("a", "golden retriev"), 2: ("a", "coffe"), 3: ("b", "golden"), 4: ("b", "golden x"), 5: ("b", "golden y")}
c.upsert("t", [m.PointStruct(id=i, vector={"d": [1, i/10], "bm25": m.SparseVector(indices=[hash(t) % 10**6 for t in s.split()], values=[1.0]*len(s.split()))},
    payload={"user_id": u, "deleted": 0, "terms": s}) for i, (u, s) in docs.items()])
scope = m.Filter(must=[m.FieldCondition(key="user_id", match=m.MatchValue(value="a"))])
qv = m.SparseVector(indices=[hash("golden") % 10**6], values=[1.0])
for p in (None, m.SearchParams(idf=m.IdfCorpusParams(corpus=scope))):
    r = c.query_points("t", query=qv, using="bm25", query_filter=scope, search_params=p)
    print("sparse local", "corpus" if p else "global", [(x.id, round(x.score, 4)) for x in r.points])
try:
    r = c.query_points("t", query=m.TextQuery(text=m.TextQueryInput(query="golden")), using="terms", query_filter=scope)
    print("text local", [(x.id, round(x.score, 4)) for x in r.points])
except Exception as e: print("text local ERROR:", type(e).__name__, e)
