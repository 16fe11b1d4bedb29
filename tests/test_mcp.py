"""The MCP server (api/mcp_server.py) through the `mcp` SDK's own client session: in-process,
over streamable HTTP and as `engram mcp` on stdio, against a real Engram; what the tools did
is checked through the HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

import httpx
import httpx2
import uvicorn
from mcp import ClientSession, Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from api.http import create_app
from api.mcp_server import build_server
from engram.domain import auth
from engram.domain.text import VISIBLE_CHAR
from tests.conftest import App, serving
from worker.embedded import free_port

TOOLS = {"memory_search", "memory_store", "memory_get", "memory_list", "memory_modify", "memory_forget",
         "memory_history"}
ENGRAM = str(Path(sys.executable).parent / "engram")
MISSING = "00000000-0000-4000-8000-000000000000"


@contextlib.asynccontextmanager
async def in_process(app: App, key: str | None):
    """A session with an in-process MCP server whose API client reaches `app` in-process too."""
    web = create_app(None)
    web.state.runtime = app.runtime
    server = build_server(url="http://engram.test", api_key=key, transport=httpx.ASGITransport(app=web))
    async with Client(server, mode="legacy") as client:
        yield client.session


@contextlib.asynccontextmanager
async def mcp_over_http(engram_url: str, api_key: str | None = None):
    """`engram mcp --transport http`'s app on a loopback port, calling the API at
    `engram_url`; yields the MCP endpoint's URL."""
    port = free_port()
    web = build_server(url=engram_url, api_key=api_key).streamable_http_app(host="127.0.0.1")
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def http_session(url: str, key: str | None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
            streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments) -> dict:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def refused(session: ClientSession, tool: str, **arguments) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return result.content[0].text


async def store(app: App, session: ClientSession, content: str, scope: dict, **fields) -> dict:
    """memory_store, then its job done, so recall finds it."""
    stored = await call(session, "memory_store", content=content, scope=scope, **fields)
    if stored["job_id"]:
        await app.wait_job(stored["job_id"])
    return stored


async def test_the_tools_say_what_they_need_and_that_forgetting_is_recoverable_and_bulk_needs_a_human(app):
    async with in_process(app, app.admin_key) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    required = {name: set(t.input_schema.get("required", [])) for name, t in tools.items()}
    assert required == {"memory_search": {"query", "scope"}, "memory_store": {"content", "scope"},
                        "memory_get": {"id"}, "memory_list": {"scope"}, "memory_modify": {"id", "reason"},
                        "memory_forget": {"reason"}, "memory_history": {"id"}}
    forget = tools["memory_forget"].description
    assert "recover" in forget and "soft delete" in forget and "PREVIEWS" in forget and "human" in forget
    assert "cannot confirm" in forget
    filters = tools["memory_search"].input_schema["$defs"]["Filters"]["properties"]
    assert {"trust", "memory_type", "min_confidence", "tags"} <= set(filters)
    assert filters["trust"]["anyOf"][0]["items"]["enum"] == ["UNTRUSTED", "SEMI_TRUSTED", "TRUSTED"]
    assert tools["memory_search"].input_schema["properties"]["limit"]["maximum"] == 100
    for name in ("memory_search", "memory_get", "memory_list", "memory_history"):
        assert tools[name].annotations.read_only_hint is True, name
    assert tools["memory_forget"].annotations.destructive_hint is True
    assert tools["memory_modify"].annotations.destructive_hint is True
    assert tools["memory_store"].annotations.destructive_hint is False
    assert all(t.output_schema for t in tools.values())
    # The wire's character regexes are left out of what the model reads; the arguments are still checked.
    assert VISIBLE_CHAR not in json.dumps([t.input_schema for t in tools.values()])


async def test_each_tool_acts_through_the_api_and_history_records_path_mcp(app):
    scope = {"user_id": "ana"}
    async with in_process(app, app.admin_key) as session:
        stored = await store(app, session, "Ana drinks green tea every morning", scope, tags=["drinks"],
                             memory_type="PREFERENCE", source_type="user")
        memory_id = stored["memory_id"]
        assert [h["memory"]["id"] for h in await app.search("green tea", scope)] == [memory_id]

        found = await call(session, "memory_search", query="what does Ana drink?", scope=scope,
                           filters={"memory_type": ["PREFERENCE"], "tags": ["drinks"]})
        assert [h["memory"]["id"] for h in found["results"]] == [memory_id]
        none = await call(session, "memory_search", query="what does Ana drink?", scope=scope,
                          filters={"memory_type": ["DECISION"]})
        assert none["results"] == []

        got = await call(session, "memory_get", id=memory_id)
        assert (got["content"], got["memory_type"], got["tags"], got["version"]) == (
            "Ana drinks green tea every morning", "PREFERENCE", ["drinks"], 1)
        page = await call(session, "memory_list", scope=scope, filters={"tags": ["drinks"]})
        assert [m["id"] for m in page["items"]] == [memory_id] and page["next_cursor"] is None

        changed = await call(session, "memory_modify", id=memory_id, reason="she switched",
                             content="Ana drinks black coffee every morning", if_version=1)
        assert (changed["content"], changed["version"]) == ("Ana drinks black coffee every morning", 2)
        assert (await app.get(f"/api/memory/{memory_id}")).json()["content"] == changed["content"]

        forgotten = await call(session, "memory_forget", id=memory_id, reason="she asked")
        assert forgotten["outcome"] == "forgotten" and forgotten["memory"]["status"] == "deleted"
        assert "recover" in forgotten["next_step"]
        assert (await app.get(f"/api/memory/{memory_id}")).json()["is_deleted"] is True

        history = await call(session, "memory_history", id=memory_id)
    assert [e["event"] for e in history["events"]] == ["ADD", "UPDATE", "DELETE"]
    assert [e["reason"] for e in history["events"]][1:] == ["she switched", "she asked"]
    events = (await app.get(f"/api/memory/{memory_id}/history")).json()["events"]
    assert [(e["event"], e["path"]) for e in events] == [("ADD", "mcp"), ("UPDATE", "mcp"), ("DELETE", "mcp")]


async def test_api_errors_are_error_results_with_their_type_and_the_session_goes_on(app):
    alice = await app.key("writer", ["user:alice"])
    reader = await app.key("reader", ["*"])
    bobs = await app.remember("Bob's locker code is 1234", {"user_id": "bob"})
    async with in_process(app, alice) as session:
        assert "not_found: " in await refused(session, "memory_get", id=MISSING)
        assert "not_found: " in await refused(session, "memory_get", id=bobs["memory_id"])
        assert "not_found: " in await refused(session, "memory_history", id=bobs["memory_id"])
        assert "forbidden: " in await refused(session, "memory_search", query="locker", scope={"user_id": "bob"})
        assert "forbidden: " in await refused(session, "memory_store", content="x", scope={"user_id": "bob"})
        missing_reason = await refused(session, "memory_modify", id=bobs["memory_id"], content="0000")
        assert "reason" in missing_reason and "Field required" in missing_reason
        both = await refused(session, "memory_forget", id=bobs["memory_id"], scope={"user_id": "bob"},
                             query="locker", reason="tidy")
        assert "validation_error: " in both
        no_scope = await refused(session, "memory_forget", query="locker", reason="tidy")
        assert "validation_error: " in no_scope
        assert "validation_error: " in await refused(session, "memory_modify", id=bobs["memory_id"], reason="x")
        blank = await refused(session, "memory_store", content=" \u200b ", scope={"user_id": "alice"})
        assert "content" in blank and "white space or invisible characters only" in blank
        # After every refusal the session still serves.
        stored = await call(session, "memory_store", content="Alice likes chess", scope={"user_id": "alice"})
        assert stored["status"] in ("processed", "queued", "raw_saved")
    async with in_process(app, reader) as session:
        assert "forbidden: " in await refused(session, "memory_store", content="x", scope={"user_id": "alice"})
        assert "forbidden: " in await refused(session, "memory_forget", id=bobs["memory_id"], reason="x")
    assert (await app.get(f"/api/memory/{bobs['memory_id']}")).json()["content"] == "Bob's locker code is 1234"
    assert (await app.get(f"/api/memory/{bobs['memory_id']}")).json()["is_deleted"] is False
    assert await app.count("SELECT count(*) FROM memories WHERE user_id = 'alice'") == 1


async def test_a_forget_by_query_only_previews_and_names_what_a_person_must_do(app):
    scope = {"user_id": "cleo"}
    ids = [(await app.remember(f"Cleo's old address was street {n}", scope, tags=["address"]))["memory_id"]
           for n in range(3)]
    async with in_process(app, app.admin_key) as session:
        result = await session.call_tool("memory_forget", {"scope": scope, "query": "old address",
                                                           "filters": {"tags": ["address"]},
                                                           "reason": "she moved"})
    assert not result.is_error, result.content[0].text
    answer = result.structured_content
    preview = answer["preview"]
    assert answer["outcome"] == "previewed" and answer["memory"] is None
    assert preview["operation_id"].startswith("forget-") and preview["total_matched"] == 3
    assert sorted(c["id"] for c in preview["candidates"]) == sorted(ids)
    assert "Nothing was deleted" in answer["next_step"] and "engram batch-forget --user-id cleo" in answer["next_step"]
    # The confirm token stays with the server: the model has no way to confirm.
    assert "confirm_token" not in result.content[0].text and "confirm_token" not in preview
    for memory_id in ids:
        assert (await app.get(f"/api/memory/{memory_id}")).json()["is_deleted"] is False
    status = (await app.get(f"/api/memory/forget/{preview['operation_id']}")).json()
    assert status["status"] == "awaiting_confirmation" and status["done"] == 0


async def test_over_streamable_http_each_session_acts_with_its_own_key_and_sees_only_its_scopes(app):
    alice = await app.key("agent", ["user:alice"])
    bob = await app.key("agent", ["user:bob"])
    async with serving(app) as engram_url, mcp_over_http(engram_url) as url, \
            http_session(url, alice) as as_alice, http_session(url, bob) as as_bob, \
            http_session(url, None) as anonymous:
        assert {t.name for t in (await as_alice.list_tools()).tools} == TOOLS
        alices = await store(app, as_alice, "Alice's cat is called Miso", {"user_id": "alice"})
        bobs = await store(app, as_bob, "Bob's cat is called Pixel", {"user_id": "bob"})
        # Interleaved on one server, neither session acts with the other's key.
        assert "not_found: " in await refused(as_bob, "memory_get", id=alices["memory_id"])
        assert "not_found: " in await refused(as_alice, "memory_get", id=bobs["memory_id"])
        assert "forbidden: " in await refused(as_bob, "memory_search", query="cat", scope={"user_id": "alice"})
        found = await call(as_alice, "memory_search", query="cat", scope={"user_id": "alice"})
        assert [h["memory"]["id"] for h in found["results"]] == [alices["memory_id"]]
        assert "unauthenticated: " in await refused(anonymous, "memory_get", id=alices["memory_id"])
    for stored, key in ((alices, alice), (bobs, bob)):
        events = (await app.get(f"/api/memory/{stored['memory_id']}/history")).json()["events"]
        assert [(e["event"], e["path"]) for e in events] == [("ADD", "mcp")]
        assert events[0]["actor_id"] == (await _key_id(app, key))


async def test_over_http_a_request_without_a_key_acts_with_the_configured_one_on_either_protocol(app):
    bob = await app.key("agent", ["user:bob"])
    alice = await app.key("agent", ["user:alice"])
    bobs = await app.remember("Bob's bike is blue", {"user_id": "bob"})
    async with serving(app) as engram_url, mcp_over_http(engram_url, api_key=bob) as url:
        for mode in ("legacy", "auto"):  # auto: the 2026-07-28 per-request protocol where the server offers it
            async with httpx2.AsyncClient(timeout=60) as http, \
                    Client(streamable_http_client(url, http_client=http), mode=mode) as as_configured:
                got = await as_configured.call_tool("memory_get", {"id": bobs["memory_id"]})
                assert not got.is_error and got.structured_content["content"] == "Bob's bike is blue", mode
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {alice}"}, timeout=60) as http, \
                    Client(streamable_http_client(url, http_client=http), mode=mode) as as_alice:
                got = await as_alice.call_tool("memory_get", {"id": bobs["memory_id"]})
                assert got.is_error and "not_found: " in got.content[0].text, mode
            async with httpx2.AsyncClient(headers={"Authorization": f"Basic {alice}"}, timeout=60) as http, \
                    Client(streamable_http_client(url, http_client=http), mode=mode) as malformed:
                got = await malformed.call_tool("memory_get", {"id": bobs["memory_id"]})
                assert got.is_error and "unauthenticated: " in got.content[0].text, mode


async def test_engram_mcp_on_stdio_serves_the_tools_with_the_key_it_was_given(app):
    scoped = await app.key("agent", ["user:dora"])
    async with serving(app) as url:
        params = StdioServerParameters(command=ENGRAM, args=["mcp", "--url", url, "--api-key", scoped])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
            stored = await store(app, session, "Dora is allergic to peanuts", {"user_id": "dora"})
            got = await call(session, "memory_get", id=stored["memory_id"])
            assert got["content"] == "Dora is allergic to peanuts"
            assert "forbidden: " in await refused(session, "memory_list", scope={"user_id": "eve"})
    events = (await app.get(f"/api/memory/{stored['memory_id']}/history")).json()["events"]
    assert [(e["event"], e["path"], e["actor_id"]) for e in events] == [("ADD", "mcp", await _key_id(app, scoped))]


async def _key_id(app: App, key: str) -> str:
    """History's actor id of `key` (`key:<its uuid>`)."""
    key_id = await app.pool.fetchval("SELECT id FROM api_keys WHERE key_hash = $1", auth.hash_key(key))
    return f"key:{key_id}"
