"""The BM25 index as a whole: its postings and statistics must come from the analyzer that
tokenises queries (`engram.domain.text.bm25_analyzer`). Writes keep them one memory at a time
(`engram.store.memories`); this rebuilds all of them when the configured analyzer changes.
"""

from __future__ import annotations

import logging
import time

import asyncpg

from engram.domain.text import term_frequencies
from engram.store import bm25

log = logging.getLogger(__name__)


async def settle_analyzer(conn: asyncpg.Connection, analyzer: str, stemmer: str, batch: int = 2_000) -> None:
    """Make the stored BM25 postings, document lengths and statistics those of `analyzer`
    (`bm25_analyzer(stemmer)`), which tokenises the queries.

    The state row is held FOR UPDATE, so of several processes starting at once one rebuilds
    and the others then find the analyzer recorded. The rebuild is one transaction: searches
    read the old postings until it commits; writes wait for it.
    """
    async with conn.transaction():
        state = await bm25.state(conn, lock="FOR UPDATE")
        if state.analyzer == analyzer:
            return
        if not await bm25.holds_memories(conn):
            await bm25.record(conn, analyzer, rebuilt=False)
            log.info("BM25 analyzer recorded", extra={"analyzer": analyzer})
            return
        log.warning("rebuilding BM25 postings", extra={"from": state.analyzer, "to": analyzer})
        started = time.perf_counter()
        await bm25.clear(conn)
        memories = postings = relengthed = 0
        cursor = await bm25.open_documents(conn)
        while rows := await cursor.fetch(batch):
            new_postings, lengths = [], []
            for row in rows:
                tf, length = term_frequencies(row["content"], stemmer)
                new_postings += [(row["id"], term, count, row["user_id"], row["agent_id"], row["run_id"])
                                 for term, count in tf.items()]
                if length != row["token_count"]:
                    lengths.append((row["id"], length))
            await bm25.copy_postings(conn, new_postings)
            await bm25.set_lengths(conn, lengths)
            memories += len(rows)
            postings += len(new_postings)
            relengthed += len(lengths)
        scopes, terms = await bm25.recount_stats(conn)
        await bm25.record(conn, analyzer, rebuilt=True)
    log.info("BM25 postings rebuilt", extra={
        "from": state.analyzer, "to": analyzer, "memories": memories, "postings": postings,
        "lengths_changed": relengthed, "scopes": scopes, "terms": terms,
        "latency_ms": round((time.perf_counter() - started) * 1000, 1)})
