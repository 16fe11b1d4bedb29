"""API keys: a caller is its key's id (the actor in history, the namespace of idempotency keys),
names are unique among active keys, and admins create, list and revoke keys over HTTP and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid

import pytest

from engram.domain import auth
from engram.store import keys
from tests.conftest import serving
from tests.process import ENGRAM

ITEM_FIELDS = {"id", "name", "role", "scopes", "created_at", "revoked_at"}


async def _insert_key(app, name: str, role: str = "writer", scopes: list[str] | None = None) -> tuple[uuid.UUID, str]:
    """A key row written straight into the database (no API involved); returns (id, secret)."""
    key_id, secret = uuid.uuid4(), auth.new_key()
    await app.pool.execute(
        "INSERT INTO api_keys (id, name, key_hash, role, scopes) VALUES ($1, $2, $3, $4, $5)",
        key_id, name, auth.hash_key(secret), role, scopes or ["*"],
    )
    return key_id, secret


async def _admin_id(app) -> uuid.UUID:
    return await app.pool.fetchval("SELECT id FROM api_keys WHERE key_hash = $1", auth.hash_key(app.admin_key))


async def _create_key(app, name: str, role: str = "writer", scopes: list[str] | None = None) -> dict:
    response = await app.post("/api/keys", {"name": name, "role": role, "scopes": scopes or ["*"]})
    assert response.status_code == 201, response.text
    return response.json()


async def _delete(app, key_id, key: str | None = None):
    return await app.http.delete(f"/api/keys/{key_id}", headers={"Authorization": f"Bearer {key or app.admin_key}"})


async def _remember_as(app, key: str, content: str, **fields):
    return await app.post("/api/memory/remember", {"content": content, "scope": {"user_id": "u1"}, "mode": "sync",
                                                   **fields}, key=key)


async def _actors(app, memory_id: str) -> tuple[str, str]:
    """(the memory's updated_by as the API shows it, its ADD history row's actor_id)."""
    memory = await app.get(f"/api/memory/{memory_id}")
    assert memory.status_code == 200, memory.text
    actor = await app.pool.fetchval("SELECT actor_id FROM memory_history WHERE memory_id = $1 AND event = 'ADD'",
                                    uuid.UUID(memory_id))
    return memory.json()["updated_by"], actor


def _error_type(response) -> str:
    return response.json()["error"]["type"]


# -- actors and idempotency -------------------------------------------------------------------


async def test_a_remembered_memory_names_the_key_id_as_its_actor(app):
    writer_id, writer = await _insert_key(app, "dev")
    by_writer = await _remember_as(app, writer, "Lena keeps bees")
    assert by_writer.status_code == 200, by_writer.text
    assert await _actors(app, by_writer.json()["memory_id"]) == (f"key:{writer_id}", f"key:{writer_id}")

    by_admin = await app.remember("Lena's hives are on the roof", mode="sync")
    admin_id = await _admin_id(app)
    assert await _actors(app, by_admin["memory_id"]) == (f"key:{admin_id}", f"key:{admin_id}")


async def test_a_new_key_reusing_a_revoked_keys_name_is_a_different_actor(app):
    old_id, old = await _insert_key(app, "dev")
    first = await _remember_as(app, old, "Marek repairs clocks")
    assert first.status_code == 200, first.text
    await app.pool.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", old_id)
    new_id, new = await _insert_key(app, "dev")
    second = await _remember_as(app, new, "Marek lives in Brno")
    assert second.status_code == 200, second.text

    assert await _actors(app, first.json()["memory_id"]) == (f"key:{old_id}", f"key:{old_id}")
    assert await _actors(app, second.json()["memory_id"]) == (f"key:{new_id}", f"key:{new_id}")


async def test_idempotency_keys_are_namespaced_per_key_not_per_name(app):
    old_id, old = await _insert_key(app, "dev")
    first = await _remember_as(app, old, "Nina plays chess", idempotency_key="k1")
    assert first.status_code == 200, first.text
    await app.pool.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", old_id)

    # A different key that happens to carry the same name: "k1" is its own, unused.
    new_id, new = await _insert_key(app, "dev")
    second = await _remember_as(app, new, "Nina plays go", idempotency_key="k1")
    assert second.status_code == 200, second.text
    assert second.json()["memory_id"] != first.json()["memory_id"]
    assert await _actors(app, second.json()["memory_id"]) == (f"key:{new_id}", f"key:{new_id}")
    assert await app.count("SELECT count(*) FROM memories") == 2


async def test_idempotency_key_is_free_for_another_key_and_still_a_conflict_for_its_own(app):
    _, alpha = await _insert_key(app, "alpha")
    _, beta = await _insert_key(app, "beta")
    first = await _remember_as(app, alpha, "Otto bakes sourdough", idempotency_key="k1")
    assert first.status_code == 200, first.text

    other_key = await _remember_as(app, beta, "Otto bakes rye bread", idempotency_key="k1")
    assert other_key.status_code == 200, other_key.text
    assert other_key.json()["memory_id"] != first.json()["memory_id"]
    by_admin = await _remember_as(app, app.admin_key, "Otto sells at the market", idempotency_key="k1")
    assert by_admin.status_code == 200, by_admin.text

    same_key = await _remember_as(app, alpha, "Otto bakes pretzels", idempotency_key="k1")
    assert same_key.status_code == 409, same_key.text
    assert _error_type(same_key) == "conflict"
    replay = await _remember_as(app, alpha, "Otto bakes sourdough", idempotency_key="k1")
    assert replay.status_code == 200 and replay.json() == first.json()
    assert await app.count("SELECT count(*) FROM memories") == 3


# -- create ------------------------------------------------------------------------------------


async def test_create_key_answers_its_id_and_secret_once_and_stores_only_a_hash(app):
    response = await app.post("/api/keys", {"name": "ci-bot", "role": "writer", "scopes": ["user:u1", "agent:*"]})
    assert response.status_code == 201, response.text
    body = response.json()
    assert {"id", "key", "name", "role", "scopes", "created_at"} <= set(body) <= ITEM_FIELDS | {"key"}
    assert body.get("revoked_at") is None and "key_hash" not in body
    assert (body["name"], body["role"], body["scopes"]) == ("ci-bot", "writer", ["user:u1", "agent:*"])
    assert body["key"].startswith("engram_")

    row = await app.pool.fetchrow("SELECT * FROM api_keys WHERE id = $1", uuid.UUID(body["id"]))
    assert row is not None
    assert (row["name"], row["role"], list(row["scopes"])) == ("ci-bot", "writer", ["user:u1", "agent:*"])
    assert row["key_hash"] == auth.hash_key(body["key"]) and row["revoked_at"] is None
    assert await app.count("SELECT count(*) FROM api_keys WHERE key_hash = $1 OR name = $1", body["key"]) == 0

    # The secret works, with the grants it was given, and acts as this key's id.
    remembered = await _remember_as(app, body["key"], "Pia writes tests")
    assert remembered.status_code == 200, remembered.text
    assert await _actors(app, remembered.json()["memory_id"]) == (f"key:{body['id']}", f"key:{body['id']}")
    outside = await app.post("/api/memory/remember", {"content": "x", "scope": {"user_id": "u2"}}, key=body["key"])
    assert outside.status_code == 403


async def test_a_second_active_key_with_the_same_name_is_a_conflict_and_writes_nothing(app):
    await _create_key(app, "ci-bot", role="writer")
    again = await app.post("/api/keys", {"name": "ci-bot", "role": "reader", "scopes": ["user:u1"]})
    assert again.status_code == 409, again.text
    assert _error_type(again) == "conflict"
    assert await app.count("SELECT count(*) FROM api_keys WHERE name = 'ci-bot'") == 1

    admin_name = await app.post("/api/keys", {"name": "admin", "role": "admin", "scopes": ["*"]})
    assert admin_name.status_code == 409, admin_name.text
    assert _error_type(admin_name) == "conflict"
    assert await app.count("SELECT count(*) FROM api_keys") == 2


async def test_concurrent_creates_of_one_name_make_exactly_one_key(app):
    responses = await asyncio.gather(*[app.post("/api/keys", {"name": "racer", "role": "writer", "scopes": ["*"]})
                                       for _ in range(8)])
    assert sorted(r.status_code for r in responses) == [201] + [409] * 7
    assert await app.count("SELECT count(*) FROM api_keys WHERE name = 'racer'") == 1


async def test_a_revoked_keys_name_can_be_used_again(app):
    first = await _create_key(app, "ci-bot")
    assert (await _delete(app, first["id"])).status_code == 200
    second = await _create_key(app, "ci-bot")
    assert second["id"] != first["id"]
    rows = await app.pool.fetch("SELECT id, revoked_at FROM api_keys WHERE name = 'ci-bot'")
    assert {str(r["id"]): r["revoked_at"] is not None for r in rows} == {first["id"]: True, second["id"]: False}
    # Only one of them may be active: the name is taken again.
    third = await app.post("/api/keys", {"name": "ci-bot", "role": "writer", "scopes": ["*"]})
    assert third.status_code == 409 and _error_type(third) == "conflict"


async def test_a_name_of_exactly_100_characters_is_accepted(app):
    body = await _create_key(app, "n" * 100)
    assert await app.count("SELECT count(*) FROM api_keys WHERE id = $1 AND name = $2",
                           uuid.UUID(body["id"]), "n" * 100) == 1


@pytest.mark.parametrize("body", [
    {"name": "", "role": "writer", "scopes": ["*"]},
    {"name": "n" * 101, "role": "writer", "scopes": ["*"]},
    {"name": "bad\x00name", "role": "writer", "scopes": ["*"]},
    {"name": 42, "role": "writer", "scopes": ["*"]},
    {"role": "writer", "scopes": ["*"]},
    {"name": "k", "role": "owner", "scopes": ["*"]},
    {"name": "k", "role": "Admin", "scopes": ["*"]},
    {"name": "k", "scopes": ["*"]},
    {"name": "k", "role": "writer", "scopes": ["user"]},
    {"name": "k", "role": "writer", "scopes": ["user:"]},
    {"name": "k", "role": "writer", "scopes": ["tenant:x"]},
    {"name": "k", "role": "writer", "scopes": ["user:u1", "**"]},
    {"name": "k", "role": "writer", "scopes": []},
    {"name": "k", "role": "writer", "scopes": "*"},
], ids=["empty-name", "long-name", "nul-in-name", "number-name", "no-name", "unknown-role", "role-case",
        "no-role", "grant-no-colon", "grant-no-id", "grant-unknown-part", "grant-junk", "no-grants", "grants-not-list"])
async def test_bad_key_input_is_a_422_and_writes_nothing(app, body):
    response = await app.post("/api/keys", body)
    assert response.status_code == 422, response.text
    assert _error_type(response) == "validation_error"
    assert await app.count("SELECT count(*) FROM api_keys") == 1


# -- list --------------------------------------------------------------------------------------


async def test_list_keys_shows_every_key_and_its_revocation_but_never_a_secret(app):
    kept = await _create_key(app, "kept", role="reader", scopes=["user:u1"])
    gone = await _create_key(app, "gone", role="writer")
    deleted = await _delete(app, gone["id"])
    assert deleted.status_code == 200, deleted.text

    response = await app.get("/api/keys")
    assert response.status_code == 200, response.text
    items = {item["id"]: item for item in response.json()["items"]}
    admin_id = str(await _admin_id(app))
    assert set(items) == {admin_id, kept["id"], gone["id"]}
    for item in items.values():
        assert set(item) == ITEM_FIELDS
    assert (items[kept["id"]]["name"], items[kept["id"]]["role"], items[kept["id"]]["scopes"]) == (
        "kept", "reader", ["user:u1"])
    assert (items[admin_id]["name"], items[admin_id]["role"], items[admin_id]["scopes"]) == ("admin", "admin", ["*"])
    assert items[kept["id"]]["revoked_at"] is None and items[admin_id]["revoked_at"] is None
    assert items[gone["id"]]["revoked_at"] is not None
    assert items[gone["id"]] == deleted.json()

    for secret in (app.admin_key, kept["key"], gone["key"]):
        assert secret not in response.text
        assert auth.hash_key(secret) not in response.text


@pytest.mark.parametrize("role", ["reader", "writer"])
async def test_only_admins_create_list_or_revoke_keys(app, role):
    caller = await app.key(role, ["*"])
    victim_id, victim = await _insert_key(app, "victim")
    before = await app.count("SELECT count(*) FROM api_keys")

    created = await app.post("/api/keys", {"name": "sneaky", "role": "admin", "scopes": ["*"]}, key=caller)
    listed = await app.get("/api/keys", key=caller)
    revoked = await _delete(app, victim_id, key=caller)
    for response in (created, listed, revoked):
        assert response.status_code == 403, response.text
        assert _error_type(response) == "forbidden"
    assert await app.count("SELECT count(*) FROM api_keys") == before
    assert await app.count("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == 0
    assert (await _remember_as(app, victim, "Quinn still works")).status_code == 200


# -- revoke ------------------------------------------------------------------------------------


async def test_a_revoked_key_is_refused_on_every_endpoint(app):
    key = await _create_key(app, "leaked", role="writer")
    remembered = await _remember_as(app, key["key"], "Rosa rides a tandem")
    assert remembered.status_code == 200, remembered.text
    memory_id, job_id = remembered.json()["memory_id"], remembered.json()["job_id"]
    assert (await app.get("/api/keys", key=key["key"])).status_code == 403  # known, just not an admin

    response = await _delete(app, key["id"])
    assert response.status_code == 200, response.text
    item = response.json()
    assert set(item) == ITEM_FIELDS
    assert (item["id"], item["name"], item["role"], item["scopes"]) == (key["id"], "leaked", "writer", ["*"])
    assert item["revoked_at"] is not None
    assert await app.pool.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", uuid.UUID(key["id"])) is not None

    headers = {"Authorization": f"Bearer {key['key']}"}
    attempts = [
        app.http.post("/api/memory/remember", json={"content": "Rosa again", "scope": {"user_id": "u1"}},
                      headers=headers),
        app.http.post("/api/memory/search", json={"query": "tandem", "scope": {"user_id": "u1"}}, headers=headers),
        app.http.get(f"/api/memory/{memory_id}", headers=headers),
        app.http.get(f"/api/memory/jobs/{job_id}", headers=headers),
        app.http.get("/api/memory", params={"user_id": "u1"}, headers=headers),
        app.http.get("/api/keys", headers=headers),
        app.http.post("/api/keys", json={"name": "x", "role": "reader", "scopes": ["*"]}, headers=headers),
        app.http.delete(f"/api/keys/{key['id']}", headers=headers),
        app.http.get("/api/keys", headers={"X-API-Key": key["key"]}),
    ]
    for refused in await asyncio.gather(*attempts):
        assert refused.status_code == 401, (refused.request.url, refused.text)
        assert _error_type(refused) == "unauthenticated"
    assert await app.count("SELECT count(*) FROM memories") == 1


async def test_an_admin_key_revoked_loses_admin_rights_at_once(app):
    second = await _create_key(app, "second-admin", role="admin")
    assert (await app.get("/api/keys", key=second["key"])).status_code == 200
    assert (await _delete(app, second["id"])).status_code == 200
    refused = await app.get("/api/keys", key=second["key"])
    assert refused.status_code == 401 and _error_type(refused) == "unauthenticated"


async def test_a_key_revoked_by_another_api_process_is_refused_here_without_waiting_for_the_cache(app, monkeypatch):
    """Key lookups are reused for a second; another API process's revocation reaches this one
    as keys.REVOKED. With the reuse stretched to an hour, only the notification can refuse it."""
    monkeypatch.setattr("engram.service.KEY_CACHE_S", 3600.0)
    key = await _create_key(app, "elsewhere", role="writer")
    assert (await _remember_as(app, key["key"], "Ines keeps bees")).status_code == 200  # looked up and reused
    async with app.pool.acquire() as conn:
        async with conn.transaction():  # what keys.revoke does in the other process
            await conn.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", uuid.UUID(key["id"]))
            await conn.execute(f"NOTIFY {keys.REVOKED}")
    for _ in range(100):
        response = await _remember_as(app, key["key"], "Ines keeps wasps")
        if response.status_code == 401:
            break
        await asyncio.sleep(0.05)
    assert response.status_code == 401 and _error_type(response) == "unauthenticated", response.text


async def test_revoking_twice_keeps_the_first_revocation(app):
    key = await _create_key(app, "twice")
    first = await _delete(app, key["id"])
    assert first.status_code == 200, first.text
    stored = await app.pool.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", uuid.UUID(key["id"]))
    await asyncio.sleep(0.05)
    again = await _delete(app, key["id"])
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert again.json()["revoked_at"] is not None
    assert await app.pool.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", uuid.UUID(key["id"])) == stored


async def test_revoking_an_unknown_key_is_404_and_a_malformed_id_is_422(app):
    unknown = await _delete(app, uuid.uuid4())
    assert unknown.status_code == 404, unknown.text
    assert _error_type(unknown) == "not_found"
    malformed = await _delete(app, "not-a-uuid")
    assert malformed.status_code == 422, malformed.text
    assert _error_type(malformed) == "validation_error"
    assert await app.count("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == 0


async def test_the_last_admin_key_with_every_scope_cannot_be_revoked(app):
    admin_id = await _admin_id(app)
    # Neither a scoped admin nor an unscoped writer can stand in for it.
    await _create_key(app, "scoped-admin", role="admin", scopes=["user:*", "agent:*", "run:*"])
    await _create_key(app, "writer", role="writer", scopes=["*"])

    refused = await _delete(app, admin_id)
    assert refused.status_code == 409, refused.text
    assert _error_type(refused) == "conflict"
    assert await app.pool.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", admin_id) is None
    assert (await app.get("/api/keys")).status_code == 200

    # With a second full admin, the first may go (even by its own hand); then the second is the last.
    spare = await _create_key(app, "spare-admin", role="admin", scopes=["*"])
    assert (await _delete(app, admin_id)).status_code == 200
    assert (await app.get("/api/keys")).status_code == 401
    last = await _delete(app, spare["id"], key=spare["key"])
    assert last.status_code == 409, last.text
    assert _error_type(last) == "conflict"
    assert (await app.get("/api/keys", key=spare["key"])).status_code == 200
    assert await app.count("SELECT count(*) FROM api_keys WHERE role = 'admin' AND '*' = ANY(scopes)"
                           " AND revoked_at IS NULL") == 1


async def test_concurrent_revokes_of_the_two_full_admins_leave_one(app):
    admin_id = await _admin_id(app)
    spare = await _create_key(app, "spare-admin", role="admin", scopes=["*"])
    responses = await asyncio.gather(_delete(app, admin_id), _delete(app, spare["id"], key=spare["key"]))
    assert sorted(r.status_code for r in responses) == [200, 409], [r.text for r in responses]
    assert await app.count("SELECT count(*) FROM api_keys WHERE role = 'admin' AND '*' = ANY(scopes)"
                           " AND revoked_at IS NULL") == 1


# -- CLI ---------------------------------------------------------------------------------------


async def _cli(url: str, key: str, *args: str) -> subprocess.CompletedProcess:
    """`engram <args>` as a child process against `url`, off the event loop the server runs on."""
    env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": key}
    return await asyncio.to_thread(subprocess.run, [ENGRAM, *args], env=env, capture_output=True, text=True,
                                   timeout=60)


def _listed_line(out: str, key_id: str) -> str:
    lines = [line for line in out.splitlines() if key_id in line]
    assert len(lines) == 1, out
    return lines[0]


async def test_cli_keys_create_prints_the_new_key_and_refuses_a_taken_name(app):
    async with serving(app) as url:
        created = await _cli(url, app.admin_key, "keys", "create", "ci-bot", "--role", "writer",
                             "--scope", "user:u1", "--scope", "agent:a1")
        assert created.returncode == 0, created.stderr
        key = json.loads(created.stdout)
        row = await app.pool.fetchrow("SELECT id, role, scopes, key_hash, revoked_at FROM api_keys WHERE name = 'ci-bot'")
        assert (row["role"], list(row["scopes"])) == ("writer", ["user:u1", "agent:a1"])
        assert row["key_hash"] == auth.hash_key(key["key"]) and row["revoked_at"] is None
        assert (key["id"], key["name"], key["role"], key["scopes"]) == (
            str(row["id"]), "ci-bot", "writer", ["user:u1", "agent:a1"])

        duplicate = await _cli(url, app.admin_key, "keys", "create", "ci-bot", "--role", "reader", "--scope", "*")
        assert duplicate.returncode != 0 and "409 conflict" in duplicate.stderr, duplicate.stderr
        assert await app.count("SELECT count(*) FROM api_keys WHERE name = 'ci-bot'") == 1


async def test_cli_keys_list_shows_each_key_and_whether_it_is_revoked(app):
    active_id, active = await _insert_key(app, "ci-bot", role="writer", scopes=["user:u1", "agent:a1"])
    gone_id, gone = await _insert_key(app, "old-bot", role="reader", scopes=["run:r9"])
    async with serving(app) as url:
        listed = await _cli(url, app.admin_key, "keys", "list")
        assert listed.returncode == 0, listed.stderr
        before = _listed_line(listed.stdout, str(gone_id))
        await app.pool.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", gone_id)
        relisted = await _cli(url, app.admin_key, "keys", "list")
        assert relisted.returncode == 0, relisted.stderr
        refused = await _cli(url, active, "keys", "list")

    active_line = _listed_line(relisted.stdout, str(active_id))
    for shown in ("ci-bot", "writer", "user:u1", "agent:a1"):
        assert shown in active_line, active_line
    gone_line = _listed_line(relisted.stdout, str(gone_id))
    for shown in ("old-bot", "reader", "run:r9"):
        assert shown in gone_line, gone_line
    assert gone_line != before and "revoked" in gone_line.lower(), (before, gone_line)
    assert _listed_line(listed.stdout, str(active_id)) == active_line  # an active key reads the same
    assert "admin" in _listed_line(relisted.stdout, str(await _admin_id(app)))
    for secret in (app.admin_key, active, gone):
        assert secret not in listed.stdout + relisted.stdout
    assert refused.returncode != 0 and "403 forbidden" in refused.stderr, refused.stderr


async def test_cli_keys_revoke_revokes_the_key_at_once(app):
    key_id, key = await _insert_key(app, "leaked", role="writer")
    async with serving(app) as url:
        assert (await _cli(url, key, "search", "anything", "--user-id", "u1")).returncode == 0
        revoked = await _cli(url, app.admin_key, "keys", "revoke", str(key_id))
        assert revoked.returncode == 0, revoked.stderr
        assert await app.pool.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", key_id) is not None
        refused = await _cli(url, key, "search", "anything", "--user-id", "u1")
        assert refused.returncode != 0 and "401 unauthenticated" in refused.stderr, refused.stderr

        unknown = await _cli(url, app.admin_key, "keys", "revoke", str(uuid.uuid4()))
        assert unknown.returncode != 0 and "404 not_found" in unknown.stderr, unknown.stderr
        last_admin = await _cli(url, app.admin_key, "keys", "revoke", str(await _admin_id(app)))
        assert last_admin.returncode != 0 and "409 conflict" in last_admin.stderr, last_admin.stderr
    assert await app.count("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == 1
