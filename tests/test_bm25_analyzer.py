"""Changing the BM25 analyzer (ENGRAM_BM25_STEMMER, or the tokeniser's version): the stored
postings, document lengths and statistics are rebuilt at start-up, once, so stored terms and
query terms meet again; an unchanged analyzer rebuilds nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import unicodedata
import uuid

import asyncpg
import pytest

from engram.domain import text
from engram.domain.errors import ConfigError
from engram.domain.text import bm25_analyzer, term_frequencies
from engram.settings import Settings
from engram.store import bm25
from engram.store import pool as pool_module
from tests.conftest import app_settings
from worker.runtime import Runtime
from worker.startup import prepare_store, wait_until_prepared

ALICE = {"user_id": "alice"}
# Under english, "running", "runs" and "ran"... meet as "run"; under none only the exact word does.
RUNNING = "Alice is running the Berlin marathon in September"
RUNS = "Alice runs along the river every morning"
LIVE = {
    "alice": [RUNNING, RUNS, "Alice's brother ran a bakery in Lyon", "The quarterly budget review moved to Thursday"],
    "alice/x": ["Alice asked the agent about trail shoes"],
}
DELETED = "Alice stopped running last winter"
REBUILT = "BM25 postings rebuilt"


@contextlib.asynccontextmanager
async def _connected(dsn: str):
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def _fill_with_english(make_app, data_dir) -> tuple[str, dict[str, str]]:
    """A database whose memories (one soft-deleted) were written under the english stemmer:
    its DSN and the memory ids by content."""
    async with make_app(data_dir=data_dir) as app:
        assert app.settings.bm25_stemmer == "english"
        ids = {}
        for text in LIVE["alice"] + [DELETED]:
            ids[text] = (await app.remember(text, scope=ALICE, mode="async"))["memory_id"]
        for text in LIVE["alice/x"]:
            ids[text] = (await app.remember(text, scope={**ALICE, "agent_id": "x"}, mode="async"))["memory_id"]
        await app.forget(ids[DELETED])
        bm25_by_id = await _bm25_by_id(app, "running")
        # Stems meet: the query's "running" scores the memory that says "runs".
        assert bm25_by_id[ids[RUNNING]] > 0 and bm25_by_id[ids[RUNS]] > 0
        return app.settings.postgres_dsn, ids


async def _bm25_by_id(app, query: str) -> dict[str, float]:
    return {h["memory"]["id"]: h["components"]["bm25"] for h in await app.search(query, scope=ALICE, limit=20)}


async def assert_stats_equal_recount(pool) -> None:
    """The statistics every search reads equal a recount of the live memories and their postings
    (the invariant tests/test_recall.py checks after incremental writes)."""
    recount = await pool.fetch(
        "SELECT scope_key, count(*) AS n, sum(token_count) AS len FROM memories WHERE NOT is_deleted GROUP BY 1")
    stats = await pool.fetch("SELECT scope_key, doc_count AS n, total_len AS len FROM bm25_scope_stats")
    assert sorted(map(tuple, stats)) == sorted(map(tuple, recount))
    df_recount = await pool.fetch(
        "SELECT m.scope_key, t.term, count(*) AS df FROM memory_terms t JOIN memories m ON m.id = t.memory_id"
        " WHERE NOT m.is_deleted GROUP BY 1, 2")
    df_stats = await pool.fetch("SELECT scope_key, term, df FROM bm25_term_stats")
    assert sorted(map(tuple, df_stats)) == sorted(map(tuple, df_recount))


async def assert_postings_are(pool, stemmer: str) -> None:
    """Every memory, deleted ones too, has exactly the postings and length `stemmer` gives its content."""
    for memory in await pool.fetch("SELECT id, content, token_count FROM memories"):
        tf, length = term_frequencies(memory["content"], stemmer)
        rows = await pool.fetch("SELECT term, tf FROM memory_terms WHERE memory_id = $1", memory["id"])
        assert {r["term"]: r["tf"] for r in rows} == dict(tf), memory["content"]
        assert memory["token_count"] == length, memory["content"]


async def _stored_state(dsn: str) -> bm25.Bm25State:
    conn = await asyncpg.connect(dsn)
    try:
        return await bm25.state(conn)
    finally:
        await conn.close()


async def _lengths(dsn: str) -> list[tuple[uuid.UUID, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch("SELECT id, token_count FROM memories")]
    finally:
        await conn.close()


async def _fresh(conn, sql: str) -> int:
    # Inside a transaction pg_stat_activity answers from a snapshot taken at its first read.
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return await conn.fetchval(sql)


def _messages(caplog, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "engram.store.lexical_index" and r.getMessage() == message]


async def test_changing_the_stemmer_rebuilds_postings_and_statistics_at_start_up(make_app, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="engram.store.lexical_index")
    dsn, ids = await _fill_with_english(make_app, tmp_path / "state")
    assert (await _stored_state(dsn)).analyzer == bm25_analyzer("english")
    assert _messages(caplog, REBUILT) == []

    async with make_app(postgres_dsn=dsn, data_dir=tmp_path / "state", bm25_stemmer="none") as app:
        state = await bm25.state(app.pool)
        assert state.analyzer == bm25_analyzer("none")
        assert state.rebuilt_at is not None
        [rebuilt] = _messages(caplog, REBUILT)
        assert (getattr(rebuilt, "from"), rebuilt.to, rebuilt.memories) == (bm25_analyzer("english"), bm25_analyzer("none"), 6)
        assert rebuilt.postings == await app.count("SELECT count(*) FROM memory_terms")
        await assert_postings_are(app.pool, "none")
        await assert_stats_equal_recount(app.pool)

        # Only the exact word meets now, with the Okapi score over the scope's 5 live memories.
        bm25_by_id = await _bm25_by_id(app, "running")
        assert bm25_by_id.get(ids[RUNS], 0) == 0
        lengths = {r["id"]: r["token_count"] for r in await app.pool.fetch(
            "SELECT id, token_count FROM memories WHERE user_id = 'alice' AND NOT is_deleted")}
        n, df, tf = 5, 1, 1
        avgdl = sum(lengths.values()) / n
        doclen = lengths[uuid.UUID(ids[RUNNING])]
        k1, b = app.settings.bm25_k1, app.settings.bm25_b
        expected = math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * doclen / avgdl))
        assert bm25_by_id[ids[RUNNING]] == pytest.approx(expected, rel=1e-6)
        assert (await _bm25_by_id(app, "runs"))[ids[RUNS]] > 0

        # Writes after the rebuild keep the invariant.
        await app.remember("Alice keeps running on Sundays", scope=ALICE, mode="async")
        await assert_stats_equal_recount(app.pool)


async def test_a_new_tokeniser_version_rebuilds_postings_and_lengths(make_app, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="engram.store.lexical_index")
    dsn, ids = await _fill_with_english(make_app, tmp_path / "state")
    lengths_before = dict(await _lengths(dsn))
    # A release whose tokeniser keeps stopwords: every document gets longer.
    monkeypatch.setattr(text, "STOPWORDS", frozenset())
    monkeypatch.setattr(text, "TOKENIZER_VERSION", text.TOKENIZER_VERSION + 1)

    async with make_app(postgres_dsn=dsn, data_dir=tmp_path / "state") as app:
        assert (await bm25.state(app.pool)).analyzer == f"v{text.TOKENIZER_VERSION}/english"
        [rebuilt] = _messages(caplog, REBUILT)
        longer = [memory_id for memory_id, length in await _lengths(dsn) if length > lengths_before[memory_id]]
        assert rebuilt.lengths_changed == len(longer) == 5  # all but DELETED, which holds no stopword
        await assert_postings_are(app.pool, "english")
        await assert_stats_equal_recount(app.pool)
        assert (await _bm25_by_id(app, "the"))[ids[RUNNING]] > 0


async def test_reopening_with_the_same_analyzer_rebuilds_nothing(make_app, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="engram.store.lexical_index")
    dsn, ids = await _fill_with_english(make_app, tmp_path / "state")
    async with make_app(postgres_dsn=dsn, data_dir=tmp_path / "state", bm25_stemmer="none") as app:
        first = await bm25.state(app.pool)
    assert len(_messages(caplog, REBUILT)) == 1
    async with make_app(postgres_dsn=dsn, data_dir=tmp_path / "state", bm25_stemmer="none") as app:
        assert await bm25.state(app.pool) == first
        assert (await _bm25_by_id(app, "running"))[ids[RUNNING]] > 0
    assert len(_messages(caplog, REBUILT)) == 1


async def test_workers_starting_together_rebuild_once(make_app, temporal, tmp_path, caplog):
    # Two worker processes of the compose deployment may start at the same time.
    caplog.set_level(logging.INFO, logger="engram.store.lexical_index")
    dsn, _ = await _fill_with_english(make_app, tmp_path / "state")
    blocker = await asyncpg.connect(dsn)
    try:
        # Hold the state row until both starters queue on it, so they race for it on release.
        held = blocker.transaction()
        await held.start()
        await blocker.execute("SELECT 1 FROM bm25_state FOR UPDATE")
        preparing = asyncio.gather(*(
            prepare_store(app_settings(tmp_path / name, dsn, bm25_stemmer="none", temporal_address=temporal.address))
            for name in ("worker-1", "worker-2")
        ), return_exceptions=True)
        deadline = asyncio.get_running_loop().time() + 20
        waiting = ("SELECT count(*) FROM pg_stat_activity"
                   " WHERE datname = current_database() AND wait_event_type = 'Lock'")
        while (queued := await _fresh(blocker, waiting)) < 2:
            if preparing.done() or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        await held.rollback()
        outcomes = await preparing
    finally:
        await blocker.close()
    assert outcomes == [None, None], outcomes
    assert queued == 2, "the starters did not wait for the state row"
    assert len(_messages(caplog, REBUILT)) == 1
    pool = await pool_module.create_pool(dsn, min_size=1, max_size=2)
    try:
        assert (await bm25.state(pool)).analyzer == bm25_analyzer("none")
        await assert_postings_are(pool, "none")
        await assert_stats_equal_recount(pool)
    finally:
        await pool.close()


async def test_an_api_process_waits_for_a_worker_to_rebuild_and_never_rebuilds_itself(make_app, temporal, tmp_path,
                                                                                    caplog):
    caplog.set_level(logging.INFO, logger="engram.store.lexical_index")
    dsn, _ = await _fill_with_english(make_app, tmp_path / "state")
    settings = app_settings(tmp_path / "api", dsn, bm25_stemmer="none", temporal_address=temporal.address)
    api_start = asyncio.create_task(wait_until_prepared(settings, timeout_s=60, poll_s=0.1))
    await asyncio.sleep(1.0)
    assert not api_start.done(), "the API process went on with postings of another analyzer"
    async with _connected(dsn) as conn:
        assert (await bm25.state(conn)).analyzer == bm25_analyzer("english"), "the API process rebuilt"
    assert _messages(caplog, REBUILT) == []
    await prepare_store(settings)  # the worker
    await asyncio.wait_for(api_start, 10)
    assert len(_messages(caplog, REBUILT)) == 1


async def test_an_api_process_gives_up_with_a_clear_error_when_no_worker_prepares(make_app, temporal, tmp_path):
    dsn, _ = await _fill_with_english(make_app, tmp_path / "state")
    settings = app_settings(tmp_path / "api", dsn, bm25_stemmer="none", temporal_address=temporal.address)
    with pytest.raises(ConfigError) as caught:
        await wait_until_prepared(settings, timeout_s=0.5, poll_s=0.1)
    assert "BM25 postings built by v" in caught.value.detail and "worker" in caught.value.detail


async def test_database_from_before_the_analyzer_was_recorded_counts_as_the_first_english(make_app, tmp_path, caplog):
    """Before 0005 every posting came from tokeniser version 1 and the english stemmer."""
    caplog.set_level(logging.INFO, logger="engram.store.lexical_index")
    dsn, ids = await _fill_with_english(make_app, tmp_path / "state")
    # Back to how a database migrated before 0005_bm25_analyzer.sql looks (0021 adds a column to its table).
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DROP TABLE bm25_state; DELETE FROM schema_migrations"
                           " WHERE name IN ('0005_bm25_analyzer', '0021_lexical_point_weights')")
    finally:
        await conn.close()

    async with make_app(postgres_dsn=dsn, data_dir=tmp_path / "state") as app:
        assert (await bm25.state(app.pool)).analyzer == bm25_analyzer("english")
        bm25_by_id = await _bm25_by_id(app, "running")
        assert bm25_by_id[ids[RUNNING]] > 0 and bm25_by_id[ids[RUNS]] > 0
    rebuilds = _messages(caplog, REBUILT)
    assert [getattr(r, "from") for r in rebuilds] == (["v1/english"] if text.TOKENIZER_VERSION > 1 else [])


async def test_fresh_database_records_the_configured_analyzer_without_rebuilding(make_app, caplog):
    caplog.set_level(logging.INFO, logger="engram.store.lexical_index")
    async with make_app(bm25_stemmer="none") as app:
        assert await bm25.state(app.pool) == bm25.Bm25State(bm25_analyzer("none"), None)
        assert _messages(caplog, REBUILT) == []
        running = (await app.remember(RUNNING, scope=ALICE, mode="async"))["memory_id"]
        runs = (await app.remember(RUNS, scope=ALICE, mode="async"))["memory_id"]
        bm25_by_id = await _bm25_by_id(app, "running")
        assert bm25_by_id[running] > 0 and bm25_by_id.get(runs, 0) == 0
        await assert_stats_equal_recount(app.pool)


async def test_unknown_stemmer_is_refused_at_start(tmp_path):
    with pytest.raises(ConfigError) as caught:
        await Runtime.open(Settings(data_dir=tmp_path, bm25_stemmer="klingon"))
    assert "ENGRAM_BM25_STEMMER" in caught.value.detail and "klingon" in caught.value.detail


async def test_words_in_any_script_are_terms(app):
    scope = {"user_id": "u-script"}
    await app.remember("Lunch at a café in Zürich with Łukasz", scope=scope, mode="sync", raw=True)
    await app.remember("Lunch at the canteen", scope=scope, mode="sync", raw=True)
    hits = await app.search("Zürich café", scope=scope)
    assert hits[0]["memory"]["content"].startswith("Lunch at a café") and hits[0]["components"]["bm25"] > 0
    assert text.bm25_terms("naïve Łukasz 東京 tower_x") == ["naïv", "łukasz", "東京", "tower", "x"]
    # Combining marks stay inside their word; decomposed and composed text give the same term.
    assert text.bm25_terms("हिन्दी भाषा مُحَمَّد", "none") == ["हिन्दी", "भाषा", "مُحَمَّد"]
    assert text.bm25_terms(unicodedata.normalize("NFD", "café"), "none") == ["café"]
    # An unspaced run is cut, so no term can pass the index row limit.
    assert text.bm25_terms("東" * 5000, "none") == ["東" * text.MAX_TERM_CHARS]
