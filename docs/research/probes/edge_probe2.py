import shutil, qdrant_edge as q
P = "/tmp/research22/shard2"; shutil.rmtree(P, ignore_errors=True)
s = q.EdgeShard.create(P, q.EdgeConfig(vectors={"d": q.EdgeVectorParams(size=2, distance=q.Distance.Cosine)}))
s.update(q.UpdateOperation.create_field_index("user_id", q.KeywordIndexParams(is_tenant=True)))
s.update(q.UpdateOperation.create_field_index("deleted", q.PayloadSchemaType.Integer))
s.update(q.UpdateOperation.create_field_index("terms", q.TextIndexParams(tokenizer=q.TokenizerType.Whitespace, lowercase=False, scoring=True)))
# payload-only points (no dense vector yet), non-ASCII term
s.update(q.UpdateOperation.upsert_points([
  q.Point(1, {}, {"user_id": "a", "deleted": 0, "terms": "हिन्दी golden"}),
  q.Point(2, {}, {"user_id": "a", "deleted": 1, "terms": "golden golden"}),
  q.Point(3, {}, {"user_id": "a", "deleted": 0, "terms": "coffe"})]))
live = q.Filter(must=[q.FieldCondition("user_id", match=q.MatchValue("a")), q.FieldCondition("deleted", match=q.MatchValue(0))])
anyd = q.Filter(must=[q.FieldCondition("user_id", match=q.MatchValue("a"))])
ps = q.SearchParams(idf=q.IdfParams(corpus=live))
tq = lambda t: q.TextQuery("terms", t, q.Bm25Params(k=1.2, b=0.75))
print("hindi", [(p.id, round(p.score,4)) for p in s.query(q.QueryRequest(limit=5, query=tq("हिन्दी"), filter=live, params=ps))])
print("include_deleted", [(p.id, round(p.score,4)) for p in s.query(q.QueryRequest(limit=5, query=tq("golden"), filter=anyd, params=ps))])
# content change: point 3 now mentions golden; dense vector added later without touching payload
s.update(q.UpdateOperation.set_payload([3], {"terms": "golden coffe"}))
s.update(q.UpdateOperation.update_vectors([q.PointVectors(3, {"d": [1.0, 0.0]})]))
print("after edit", [(p.id, round(p.score,4)) for p in s.query(q.QueryRequest(limit=5, query=tq("golden"), filter=live, params=ps))])
print("dense", [(p.id, round(p.score,4)) for p in s.query(q.QueryRequest(limit=5, query=q.Query.Nearest([1.0, 0.0], using="d"), filter=live))])
print("count", s.count(q.CountRequest(exact=True)))
s.close()
