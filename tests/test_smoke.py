async def test_remember_then_recall(app):
    answer = await app.remember("I love hiking in the Alps", mode="sync")
    assert answer["status"] == "processed"
    hits = await app.search("mountain walks")
    assert hits[0]["memory"]["id"] == answer["memory_id"]
