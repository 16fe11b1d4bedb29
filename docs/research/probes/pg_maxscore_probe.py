"""Exact top-k BM25 in Postgres with list-level MaxScore pruning, against today's aggregation.

One database holds N memories in one scope ("big") plus N spread over 1,000 scopes. Texts are
LoCoMo dev turns, cycled, each with a unique tail term; 2% are soft-deleted. Queries are 200
LoCoMo dev questions. For each, today's `memories.bm25_scores(limit=100)` and the pruned
version below are timed in turn and their top 100 compared (ids and scores).

The pruned version reads, per query term, the first M postings in (tf DESC, token_count ASC)
order (an index), scores the union exactly, and stops when no unseen memory can beat the k-th
score: an unseen memory holds no fully read term, and each other term can give it at most
the weight of the posting at that term's list end. Otherwise M grows 4× and it reads again.

Usage: python docs/research/probes/pg_maxscore_probe.py [N] (from the repo root, machine idle).
"""
import asyncio
import random
import sys
import time
import uuid
from collections import Counter, defaultdict
from math import log

import numpy as np

sys.path.insert(0, ".")
from bench import locomo_data  # noqa: E402
from engram.domain.auth import EVERYTHING  # noqa: E402
from engram.domain.filters import Filters  # noqa: E402
from engram.domain.models import Scope  # noqa: E402
from engram.domain.text import bm25_terms, content_hash, normalize  # noqa: E402
from engram.store import memories as repo  # noqa: E402
from engram.store import migrate  # noqa: E402
from engram.store import pool as pool_module  # noqa: E402
from engram.store.sql import Where  # noqa: E402
from worker.embedded import EmbeddedPostgres, free_port  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
K1, B, K = 1.2, 0.75, 100  # K: the service's search_candidates


async def load(pool, turns: list[str]) -> None:
    analysed = [bm25_terms(t) for t in turns]
    stats = repo.StatsDelta()
    t0 = time.perf_counter()
    for start in range(0, 2 * N, 5_000):
        rows, postings = [], []
        for i in range(start, min(start + 5_000, 2 * N)):
            user = "big" if i < N else f"small-{i % 1000}"
            text = f"{turns[i % len(turns)]} tail{i}"
            terms = analysed[i % len(turns)] + [f"tail{i}"]
            tf = Counter(terms)
            mid = uuid.uuid4()
            rows.append((mid, user, text, normalize(text), content_hash(normalize(text)), len(terms), i % 50 == 0))
            postings += [(mid, term, n, user, len(terms)) for term, n in tf.items()]
            if i % 50:
                stats.add(Scope(user_id=user), dict(tf), len(terms))
        async with pool.acquire() as conn, conn.transaction():
            await conn.copy_records_to_table("memories", records=[r + ("probe",) for r in rows], columns=[
                "id", "user_id", "content", "normalized_content", "content_hash", "token_count", "is_deleted",
                "updated_by"])
            await conn.copy_records_to_table("memory_terms", records=postings, columns=[
                "memory_id", "term", "tf", "user_id", "token_count"])
    async with pool.acquire() as conn, conn.transaction():
        await repo.add_stats(conn, stats)
    print(f"loaded {2 * N} memories in {time.perf_counter() - t0:.0f} s", flush=True)


def weight(idf: float, tf: int, dl: int, avgdl: float) -> float:
    return idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / max(avgdl, 1)))


async def pruned(conn, scope: Scope, filters: Filters, terms: list[str], k: int, m: int = 128) -> tuple[dict, int]:
    """(top k {id: score}, rounds)."""
    terms = sorted(set(terms))
    if not terms:
        return {}, 0
    where_s = Where([terms])
    where_s.scope(scope, "s")
    where_s.visible(filters.visible, "s")
    stat_rows = await conn.fetch(f"""
        WITH scopes AS (SELECT s.scope_key, s.doc_count, s.total_len FROM bm25_scope_stats s WHERE {where_s.sql()})
        SELECT NULL AS term, coalesce(sum(doc_count), 0)::float8 AS n,
               coalesce(sum(total_len), 0)::float8 / greatest(coalesce(sum(doc_count), 0), 1) AS v FROM scopes
        UNION ALL
        SELECT ts.term, NULL, sum(ts.df)::float8 FROM bm25_term_stats ts JOIN scopes USING (scope_key)
        WHERE ts.term = ANY($1::text[]) GROUP BY ts.term""", *where_s.params)
    n, avgdl = next((r["n"], r["v"]) for r in stat_rows if r["term"] is None)
    df = {r["term"]: r["v"] for r in stat_rows if r["term"] is not None}
    idf = {t: log(1 + max(n - df[t] + 0.5, 0) / (df[t] + 0.5)) for t in terms if t in df}
    terms = [t for t in terms if t in idf]
    if not terms:
        return {}, 0
    rounds = 0
    while True:
        rounds += 1
        where = Where([terms, m])
        where.scope(scope, "t")
        where.filters(filters, "mm")
        rows = await conn.fetch(f"""
            SELECT q.term, p.memory_id, p.tf, p.token_count FROM unnest($1::text[]) AS q(term)
            CROSS JOIN LATERAL (
                SELECT t.memory_id, t.tf, t.token_count FROM memory_terms t JOIN memories mm ON mm.id = t.memory_id
                WHERE t.term = q.term AND {where.sql()}
                ORDER BY t.tf DESC, t.token_count ASC LIMIT $2) p""", *where.params)
        lists = defaultdict(list)
        for r in rows:
            lists[r["term"]].append(r)
        open_terms = [t for t in terms if len(lists[t]) >= m]  # not read to the end
        seen = {(r["memory_id"], r["term"]): r["tf"] for r in rows}
        length = {r["memory_id"]: r["token_count"] for r in rows}
        ids = list(length)
        if open_terms:  # a candidate may hold an open term past its list's end: read its tf
            for r in await conn.fetch("SELECT memory_id, term, tf FROM memory_terms WHERE memory_id = ANY($1::uuid[])"
                                      " AND term = ANY($2::text[])", ids, open_terms):
                seen[(r["memory_id"], r["term"])] = r["tf"]
        scores = defaultdict(float)
        for (mid, term), tf in seen.items():
            scores[mid] += weight(idf[term], tf, length[mid], avgdl)
        top = dict(sorted(scores.items(), key=lambda kv: -kv[1])[:k])
        theta = min(top.values()) if len(top) >= k else 0.0
        bound = 0.0
        for t in open_terms:
            last = lists[t][-1]
            bound += max(weight(idf[t], last["tf"], last["token_count"], avgdl),
                         weight(idf[t], last["tf"] - 1, 1, avgdl) if last["tf"] > 1 else 0.0)
        if not open_terms or bound < theta:
            return top, rounds
        m *= 4


async def main() -> None:
    server = EmbeddedPostgres(__import__("pathlib").Path("/tmp/research22/pgprobe"), free_port())
    server.start()
    try:
        await migrate.migrate(server.dsn())
        pool = await pool_module.create_pool(server.dsn(), min_size=1, max_size=2)
        async with pool.acquire() as conn:
            await conn.execute("ALTER TABLE memory_terms ADD COLUMN IF NOT EXISTS token_count integer")
        convs = locomo_data.load()[0]
        turns = [t.text for c in convs for t in c.turns]
        if not await pool.fetchval("SELECT count(*) FROM memories"):
            await load(pool, turns)
        async with pool.acquire() as conn:
            await conn.execute("CREATE INDEX IF NOT EXISTS memory_terms_user_impact ON memory_terms"
                               " (user_id, term, tf DESC, token_count)")
            await conn.execute("VACUUM ANALYZE")
        questions = [q.question for c in convs for q in c.questions]
        queries = random.Random(7).sample(questions, 200)
        filters = Filters(visible=EVERYTHING)
        for user in ("big", "small-7"):
            scope = Scope(user_id=user)
            lat = {"today": [], "pruned": []}
            rounds, diffs = Counter(), 0
            async with pool.acquire() as conn:
                for query in queries:
                    terms = bm25_terms(query)
                    t = time.perf_counter()
                    exact = await repo.bm25_scores(conn, scope, filters, terms, k1=K1, b=B, limit=K)
                    lat["today"].append((time.perf_counter() - t) * 1e3)
                    t = time.perf_counter()
                    got, r = await pruned(conn, scope, filters, terms, K)
                    lat["pruned"].append((time.perf_counter() - t) * 1e3)
                    rounds[r] += 1
                    a = sorted(exact.values(), reverse=True)
                    b = sorted(got.values(), reverse=True)
                    if len(a) != len(b) or any(abs(x - y) > 1e-6 for x, y in zip(a, b)):
                        diffs += 1
            for name, values in lat.items():
                print(f"{user:8s} {name:7s} p50 {np.percentile(values, 50):7.2f}  p95 {np.percentile(values, 95):7.2f}"
                      f"  p99 {np.percentile(values, 99):7.2f} ms", flush=True)
            print(f"{user:8s} rounds {dict(sorted(rounds.items()))}  top-{K} score lists differing: {diffs}", flush=True)
        await pool.close()
    finally:
        server.stop()


asyncio.run(main())
