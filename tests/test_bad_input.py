"""Bad input at the HTTP gateway. Whatever a client sends, a value the service cannot store or
does not accept is a 422 `{"error": {"type": "validation_error", "detail"}}` that says what is
wrong and where, never a 500; it writes nothing; and the connection it came on stays usable.

Bodies are sent as raw JSON text (`json.dumps`, which writes a lone surrogate as the escape
`"\\ud800"` and NaN as `NaN`, as a client would), not through httpx's `json=`, which refuses to
encode them. Most cases share one app (module-scoped): a refused request writes nothing, so the
cases cannot disturb one another, and every "nothing written" check compares row counts before
and after. Its in-process client does not re-raise app exceptions, so a crash shows as the 500
the client would see.
"""

from __future__ import annotations

import base64
import json
import uuid

import httpx
import pytest

from api.http import create_app
from tests.conftest import App, app_settings, new_database, running_app, serving

REMEMBER, SEARCH, LIST, KEYS = "/api/memory/remember", "/api/memory/search", "/api/memory", "/api/keys"
WRITTEN = ("memories", "memory_history", "memory_jobs", "api_keys", "idempotency_keys")
MIB = 1 << 20


@pytest.fixture(scope="module")
async def gateway(postgres, temporal, embedder, reranker, tmp_path_factory):
    """One Engram for the module, reached in-process by a client that shows a crash as a 500."""
    settings = app_settings(tmp_path_factory.mktemp("bad-input"), await new_database(postgres),
                            temporal_address=temporal.address)
    async with running_app(settings, embedder, reranker) as running:
        web = create_app(None)
        web.state.runtime = running.runtime
        transport = httpx.ASGITransport(app=web, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://engram.test", timeout=60) as http:
            yield App(running.runtime, http, running.admin_key)


def headers(app: App) -> dict:
    return {"Authorization": f"Bearer {app.admin_key}", "content-type": "application/json"}


async def send(app: App, path: str, body) -> httpx.Response:
    """POST `body`: a dict/list (dumped as a client's JSON text), a str (raw JSON text) or bytes."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    return await app.http.post(path, content=body, headers=headers(app))


async def written(app: App) -> dict[str, int]:
    return {table: await app.count(f"SELECT count(*) FROM {table}") for table in WRITTEN}


def assert_refused(response: httpx.Response, *where: str) -> str:
    """A 422 validation_error whose detail names each of `where`; returns the detail."""
    assert response.status_code == 422, f"{response.status_code}: {response.text[:500]}"
    error = response.json()["error"]
    assert error["type"] == "validation_error", error
    for fragment in where:
        assert fragment.lower() in error["detail"].lower(), error
    return error["detail"]


async def assert_refused_and_nothing_written(app: App, path: str, body, *where: str) -> str:
    before = await written(app)
    detail = assert_refused(await send(app, path, body), *where)
    assert await written(app) == before
    return detail


async def remember_settled(app: App, content: str, scope: dict) -> str:
    """Remember `content` and wait until its pipeline is done (no late writes); its memory id."""
    response = await send(app, REMEMBER, {"content": content, "scope": scope, "mode": "sync"})
    assert response.status_code == 200, response.text
    answer = response.json()
    await app.wait_job(answer["job_id"], "done")
    return answer["memory_id"]


def remember_body(**fields) -> dict:
    return {"content": "Lena keeps bees on her roof", "scope": {"user_id": "bad-input"}, **fields}


def search_body(**fields) -> dict:
    return {"query": "bees", "scope": {"user_id": "bad-input"}, **fields}


def nested(depth: int, leaf=1) -> dict:
    """`depth` objects, each inside the last: nested(1) == {"a": 1}."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


# -- unstorable strings: NUL characters and lone surrogates ------------------------------------

NUL, HIGH, LOW = "\x00", "\ud800", "\udfff"


@pytest.mark.parametrize("fields, where", [
    ({"content": f"bees{NUL}honey"}, "content"),
    ({"content": NUL}, "content"),
    ({"metadata": {f"hive{NUL}": 1}}, "metadata"),
    ({"metadata": {"hive": f"north{NUL}"}}, "metadata"),
    ({"metadata": {"a": {"b": ["ok", f"deep{NUL}"]}}}, "metadata"),
    ({"metadata": {"a": {f"deep{NUL}key": True}}}, "metadata"),
    ({"tags": ["bees", f"ho{NUL}ney"]}, "tags"),
    ({"who": f"Lena{NUL}"}, "who"),
    ({"type": f"fact{NUL}"}, "type"),
    ({"session_id": f"s{NUL}1"}, "session_id"),
    ({"source_type": f"chat{NUL}"}, "source_type"),
    ({"source_id": f"m{NUL}1"}, "source_id"),
    ({"idempotency_key": f"req{NUL}1"}, "idempotency_key"),
    ({"scope": {"user_id": f"u{NUL}1"}}, "user_id"),
    ({"scope": {"user_id": "u1", "agent_id": f"a{NUL}"}}, "agent_id"),
    ({"scope": {"user_id": "u1", "run_id": f"{NUL}r"}}, "run_id"),
    ({"content": f"bees{HIGH}honey"}, "content"),
    ({"content": f"{LOW}"}, "content"),
    ({"content": f"x{LOW}{HIGH}y"}, "content"),  # the wrong order: not a pair
    ({"metadata": {f"hive{HIGH}": 1}}, "metadata"),
    ({"metadata": {"hive": f"north{LOW}"}}, "metadata"),
    ({"metadata": {"a": [{"b": f"deep{HIGH}"}]}}, "metadata"),
    ({"tags": [f"honey{LOW}"]}, "tags"),
], ids=[
    "nul-in-content", "content-only-nul", "nul-in-metadata-key", "nul-in-metadata-value",
    "nul-in-nested-metadata-value", "nul-in-nested-metadata-key", "nul-in-tag", "nul-in-who", "nul-in-type",
    "nul-in-session_id", "nul-in-source_type", "nul-in-source_id", "nul-in-idempotency_key",
    "nul-in-user_id", "nul-in-agent_id", "nul-in-run_id",
    "high-surrogate-in-content", "content-only-low-surrogate", "reversed-surrogates-in-content",
    "surrogate-in-metadata-key", "surrogate-in-metadata-value", "surrogate-in-nested-metadata",
    "surrogate-in-tag",
])
async def test_unstorable_text_in_a_remember_is_a_422_naming_the_field_and_writes_nothing(gateway, fields, where):
    await assert_refused_and_nothing_written(gateway, REMEMBER, remember_body(**fields), where)


async def test_a_surrogate_pair_is_ordinary_text_and_is_stored(gateway):
    # The escape pair "\ud83d\udc1d" is one character (a bee); only a lone half is unstorable.
    memory_id = await remember_settled(gateway, "Lena's bees \U0001f41d swarmed", {"user_id": "pair"})
    stored = (await gateway.get(f"/api/memory/{memory_id}")).json()
    assert stored["content"] == "Lena's bees \U0001f41d swarmed"


@pytest.mark.parametrize("fields, where", [
    ({"query": f"bees{NUL}"}, "query"),
    ({"query": f"bees{HIGH}"}, "query"),
    ({"scope": {"user_id": f"u{NUL}"}}, "user_id"),
    ({"scope": {"agent_id": f"a{NUL}"}}, "agent_id"),
    ({"scope": {"run_id": f"r{NUL}"}}, "run_id"),
    ({"filters": {"type": f"fact{NUL}"}}, "type"),
    ({"filters": {"tags": [f"honey{NUL}"]}}, "tags"),
    ({"filters": {"who": f"Lena{NUL}"}}, "who"),
    ({"filters": {"who": f"Lena{LOW}"}}, "who"),
    ({"filters": {"source_type": f"chat{NUL}"}}, "source_type"),
    ({"filters": {"time": f"last 3 days{NUL}"}}, "time"),
], ids=[
    "nul-in-query", "surrogate-in-query", "nul-in-user_id", "nul-in-agent_id", "nul-in-run_id",
    "nul-in-type-filter", "nul-in-tags-filter", "nul-in-who-filter", "surrogate-in-who-filter",
    "nul-in-source_type-filter", "nul-in-time-filter",
])
async def test_unstorable_text_in_a_search_is_a_422_naming_the_field(gateway, fields, where):
    assert_refused(await send(gateway, SEARCH, search_body(**fields)), where)


@pytest.mark.parametrize("params, where", [
    ({"user_id": f"u{NUL}"}, "user_id"),
    ({"user_id": "u1", "agent_id": NUL}, "agent_id"),
    ({"user_id": "u1", "run_id": f"r{NUL}"}, "run_id"),
    ({"user_id": "u1", "who": f"Lena{NUL}"}, "who"),
    ({"user_id": "u1", "tags": ["bees", f"honey{NUL}"]}, "tags"),
    ({"user_id": "u1", "type": f"fact{NUL}"}, "type"),
    ({"user_id": "u1", "source_type": f"chat{NUL}"}, "source_type"),
    ({"user_id": "u1", "time": f"today{NUL}"}, "time"),
    ({"user_id": "u1", "cursor": cursor(f"2024-05-01T00:00:00+00:00|{uuid.uuid4()}") + NUL}, "cursor"),
], ids=["user_id", "agent_id", "run_id", "who", "tags", "type", "source_type", "time", "cursor"])
async def test_a_nul_in_a_list_query_parameter_is_a_422_naming_it(gateway, params, where):
    assert_refused(await gateway.get(LIST, **params), where)


@pytest.mark.parametrize("body, where", [
    ({"name": f"ci{NUL}bot", "role": "reader", "scopes": ["user:alice"]}, "name"),
    ({"name": f"ci{HIGH}bot", "role": "reader", "scopes": ["user:alice"]}, "name"),
    ({"name": "ci-bot", "role": "reader", "scopes": [f"user:ali{NUL}ce"]}, "scopes"),
    ({"name": "ci-bot", "role": "reader", "scopes": ["user:bob", f"agent:{NUL}"]}, "scopes"),
    ({"name": "ci-bot", "role": f"reader{NUL}", "scopes": ["user:alice"]}, "role"),
], ids=["nul-in-name", "surrogate-in-name", "nul-in-grant", "nul-as-grant-id", "nul-in-role"])
async def test_unstorable_text_in_a_new_key_is_a_422_and_creates_no_key(gateway, body, where):
    await assert_refused_and_nothing_written(gateway, KEYS, body, where)


# -- numbers JSON cannot carry, and metadata bounds ---------------------------------------------

def _raw_remember(metadata_json: str) -> str:
    return '{"content": "Lena keeps bees", "scope": {"user_id": "bad-input"}, "metadata": ' + metadata_json + "}"


@pytest.mark.parametrize("metadata_json", [
    '{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e400}', '{"x": -1e400}',
    '{"x": [1, 2, NaN]}', '{"a": {"b": {"c": Infinity}}}',
], ids=["nan", "infinity", "minus-infinity", "1e400", "minus-1e400", "nan-in-list", "nested-infinity"])
async def test_a_non_finite_number_in_metadata_is_a_422_and_writes_nothing(gateway, metadata_json):
    await assert_refused_and_nothing_written(gateway, REMEMBER, _raw_remember(metadata_json), "metadata")


@pytest.mark.parametrize("metadata", [
    nested(33), nested(500), {"ok": 1, "deep": nested(32)}, {"list": [[[[[[[[[[[nested(21)]]]]]]]]]]]},
], ids=["33-deep", "500-deep", "33-deep-beside-a-shallow-key", "deep-through-lists"])
async def test_metadata_nested_over_32_levels_is_a_422_and_writes_nothing(gateway, metadata):
    await assert_refused_and_nothing_written(gateway, REMEMBER, remember_body(metadata=metadata), "metadata")


async def test_metadata_over_64_kib_is_a_422_and_writes_nothing(gateway):
    body = remember_body(metadata={"pad": "x" * (64 * 1024)})
    assert len(json.dumps(body)) < MIB
    await assert_refused_and_nothing_written(gateway, REMEMBER, body, "metadata")


async def test_metadata_within_the_bounds_is_stored(gateway):
    metadata = {"deep": nested(31, leaf=1.5), "list": [1, -2, "ok"], "pad": "y" * 60_000}
    response = await send(gateway, REMEMBER, {"content": "Lena sells honey", "scope": {"user_id": "meta-ok"},
                                              "metadata": metadata, "mode": "async"})
    assert response.status_code == 200, response.text[:500]
    stored = (await gateway.get(f"/api/memory/{response.json()['memory_id']}")).json()
    assert stored["metadata"] == metadata
    await gateway.wait_job(response.json()["job_id"], "done")


# -- a refused request leaves the keep-alive connection usable ----------------------------------

def local_port(response: httpx.Response) -> int | None:
    """The client side's port of the connection `response` came on; None once it is closed."""
    try:
        return response.extensions["network_stream"].get_extra_info("client_addr")[1]
    except OSError:
        return None


@pytest.mark.parametrize("bad", [f"bees{NUL}honey", f"bees{HIGH}honey"], ids=["nul", "lone-surrogate"])
async def test_after_a_refused_request_the_same_keep_alive_connection_serves_the_next(gateway, bad):
    scope = {"user_id": f"keep-alive-{uuid.uuid4().hex[:6]}"}
    async with serving(gateway) as url:
        async with httpx.AsyncClient(base_url=url, headers=headers(gateway), timeout=30) as client:
            refused = await client.post(REMEMBER, content=json.dumps({"content": bad, "scope": scope}).encode())
            port = local_port(refused)
            accepted = await client.post(REMEMBER, content=json.dumps(
                {"content": "Lena keeps bees", "scope": scope, "mode": "sync"}).encode())
            assert accepted.status_code == 200, accepted.text
            assert port is not None and local_port(accepted) == port, "the server closed the connection"
            assert_refused(refused, "content")
        await gateway.wait_job(accepted.json()["job_id"], "done")


# -- time filters -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
async def dated(gateway):
    """A scope holding one memory written just now: (scope, memory id)."""
    scope = {"user_id": "time-filters"}
    return scope, await remember_settled(gateway, "Lena harvested forty jars of honey", scope)


async def search_ids(app: App, scope: dict, filters: dict) -> list[str]:
    response = await send(app, SEARCH, {"query": "honey harvest", "scope": scope, "filters": filters})
    assert response.status_code == 200, f"{response.status_code}: {response.text[:500]}"
    return [hit["memory"]["id"] for hit in response.json()["results"]]


async def list_ids(app: App, scope: dict, **params) -> list[str]:
    response = await app.get(LIST, **scope, **params)
    assert response.status_code == 200, f"{response.status_code}: {response.text[:500]}"
    return [item["id"] for item in response.json()["items"]]


@pytest.mark.parametrize("phrase", ["last 5000 years", "last 999999999 days", "past 99999999 weeks",
                                    "in the last 100000 months"])
async def test_a_huge_look_back_is_clamped_and_finds_what_was_just_written(gateway, dated, phrase):
    scope, memory_id = dated
    assert await search_ids(gateway, scope, {"time": phrase}) == [memory_id]
    assert await list_ids(gateway, scope, time=phrase) == [memory_id]


@pytest.mark.parametrize("phrase", ["3000 years ago", "older than 99999 years", "999999999 days ago",
                                    "older than 999999999 weeks"])
async def test_a_time_before_the_calendar_starts_finds_nothing_without_error(gateway, dated, phrase):
    scope, _ = dated
    assert await search_ids(gateway, scope, {"time": phrase}) == []
    assert await list_ids(gateway, scope, time=phrase) == []


@pytest.mark.parametrize("phrase", ["last " + "9" * 5000 + " days", "last \u00b2 days", "older than \u2460 years"],
                         ids=["5000-digit-count", "superscript-two", "circled-one"])
async def test_a_time_phrase_count_that_is_no_plain_number_is_a_422(gateway, dated, phrase):
    scope, _ = dated
    assert_refused(await send(gateway, SEARCH, search_body(scope=scope, filters={"time": phrase})), "time")
    assert_refused(await gateway.get(LIST, **scope, time=phrase), "time")


@pytest.mark.parametrize("filters, where", [
    ({"time": "last 3 days", "time_range": {"start": "2024-01-01T00:00:00"}}, "start"),
    ({"time": "last 3 days", "time_range": {"end": "2099-01-01T00:00:00"}}, "end"),
    ({"time_range": {"start": "2024-01-01T00:00:00"}}, "start"),
    ({"time_range": {"start": "2024-01-01T00:00:00Z", "end": "2025-01-01T00:00:00"}}, "end"),
    ({"time_range": {"start": "2025-01-01T00:00:00Z", "end": "2024-01-01T00:00:00Z"}}, "start"),
    ({"time_range": {"start": "0001-01-01T00:00:00+14:00"}}, "start"),
    ({"time_range": {"end": "9999-12-31T23:59:59-14:00"}}, "end"),
], ids=["naive-start-with-phrase", "naive-end-with-phrase", "naive-start", "naive-end", "start-after-end",
        "start-before-year-1-in-utc", "end-after-year-9999-in-utc"])
async def test_a_bad_time_range_is_a_422(gateway, dated, filters, where):
    scope, _ = dated
    assert_refused(await send(gateway, SEARCH, search_body(scope=scope, filters=filters)), where)


async def test_a_time_range_spanning_the_whole_calendar_finds_what_was_just_written(gateway, dated):
    scope, memory_id = dated
    whole = {"start": "0001-01-01T00:00:00Z", "end": "9999-12-31T23:59:59Z"}
    assert await search_ids(gateway, scope, {"time_range": whole}) == [memory_id]
    assert await search_ids(gateway, scope, {"time_range": whole, "time": "last 3 days"}) == [memory_id]
    assert await search_ids(gateway, scope, {"time_range": {"end": "0001-01-01T00:00:00Z"}}) == []


async def test_a_cursor_at_year_1_is_an_empty_page(gateway, dated):
    scope, _ = dated
    response = await gateway.get(LIST, **scope, cursor=cursor(f"0001-01-01T00:00:00+00:00|{uuid.uuid4()}"))
    assert response.status_code == 200, response.text
    assert response.json() == {"items": [], "next_cursor": None}


@pytest.mark.parametrize("value", [
    cursor(f"2999-01-01T00:00:00|{uuid.uuid4()}"),
    cursor("hello"),
    cursor(f"2999-01-01T00:00:00+00:00|{uuid.uuid4()}|extra"),
    cursor(f"2999-01-01T00:00:00+00:00|{uuid.uuid4()}{NUL}"),
    cursor(f"2999-01-01T00:00:00+00:00{NUL}|{uuid.uuid4()}"),
    "not base64 at all!",
], ids=["naive-timestamp", "not-the-format", "three-parts", "nul-after-id", "nul-in-timestamp", "not-base64"])
async def test_a_malformed_list_cursor_is_a_422(gateway, dated, value):
    scope, _ = dated
    assert_refused(await gateway.get(LIST, **scope, cursor=value), "cursor")


# -- the 1 MiB body cap counts the bytes actually read ------------------------------------------

async def chunks(body: bytes, size: int = 64 * 1024):
    for start in range(0, len(body), size):
        yield body[start:start + size]


def oversized_body() -> bytes:
    return json.dumps(remember_body(content="honey " * (10 * MIB // 6))).encode()


def assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, f"{response.status_code}: {response.text[:300]}"
    assert response.json()["error"]["type"] == "payload_too_large"


async def test_a_chunked_body_over_1_mib_is_a_413_on_a_real_server_and_writes_nothing(gateway):
    body = oversized_body()
    assert len(body) > 10 * MIB - 100
    before = await written(gateway)
    async with serving(gateway) as url:
        async with httpx.AsyncClient(base_url=url, headers=headers(gateway), timeout=60) as client:
            request = client.build_request("POST", REMEMBER, content=chunks(body))
            assert "content-length" not in request.headers and request.headers["transfer-encoding"] == "chunked"
            assert_too_large(await client.send(request))
    assert await written(gateway) == before


async def test_a_chunked_body_over_1_mib_is_a_413_in_process_and_writes_nothing(gateway):
    before = await written(gateway)
    assert_too_large(await gateway.http.post(REMEMBER, content=chunks(oversized_body()), headers=headers(gateway)))
    assert await written(gateway) == before


async def test_a_chunked_body_under_1_mib_is_judged_on_its_content_not_its_size(gateway):
    too_long = json.dumps(remember_body(content="x" * 100_000)).encode()
    assert 100_000 < len(too_long) < MIB
    response = await gateway.http.post(REMEMBER, content=chunks(too_long), headers=headers(gateway))
    assert_refused(response, "content")
    # Valid content padded with JSON white space to just under 1 MiB is accepted.
    text = json.dumps({"content": "Lena's hives are on the roof", "scope": {"user_id": "padded"}, "mode": "async"})
    padded = (text[:-1] + " " * (MIB - 1024 - len(text)) + "}").encode()
    assert MIB - 1024 == len(padded)
    async with serving(gateway) as url:
        async with httpx.AsyncClient(base_url=url, headers=headers(gateway), timeout=60) as client:
            response = await client.post(REMEMBER, content=chunks(padded))
    assert response.status_code == 200, response.text[:500]
    await gateway.wait_job(response.json()["job_id"], "done")


# -- strict types on the wire -------------------------------------------------------------------

WRONG_TYPES = [
    (REMEMBER, "pinned", "yes"), (REMEMBER, "pinned", 1), (REMEMBER, "pinned", "true"),
    (REMEMBER, "raw", "true"), (REMEMBER, "raw", 0), (REMEMBER, "importance", "0.5"),
    (REMEMBER, "pipeline_timeout_ms", "100"), (REMEMBER, "pipeline_timeout_ms", 100.5),
    (SEARCH, "explain", 0), (SEARCH, "include_deleted", "true"), (SEARCH, "rerank", 1), (SEARCH, "limit", "10"),
    (SEARCH, "limit", 10.5), (SEARCH, "rerank_top_n", "5"),
]


@pytest.mark.parametrize("path, field, value", WRONG_TYPES,
                         ids=[f"{p.rsplit('/', 1)[1]}-{field}={json.dumps(value)}" for p, field, value in WRONG_TYPES])
async def test_a_value_of_the_wrong_json_type_is_a_422_not_coerced(gateway, path, field, value):
    body = remember_body(**{field: value}) if path == REMEMBER else search_body(**{field: value})
    await assert_refused_and_nothing_written(gateway, path, body, field)


async def test_an_integer_where_a_number_is_expected_is_accepted(gateway):
    response = await send(gateway, REMEMBER, remember_body(content="Lena's queen bee is two years old",
                                                           importance=1, pinned=True, mode="async"))
    assert response.status_code == 200, response.text
    stored = (await gateway.get(f"/api/memory/{response.json()['memory_id']}")).json()
    assert stored["importance"] == 1.0 and stored["pinned"] is True
    await gateway.wait_job(response.json()["job_id"], "done")


async def test_list_query_parameters_are_read_from_their_text(gateway, dated):
    scope, memory_id = dated
    assert await list_ids(gateway, scope, limit="10", include_deleted="true") == [memory_id]


# -- text that shows nothing is empty -----------------------------------------------------------

INVISIBLE = {
    "zero-width-spaces": "\u200b\u200b\u200b",
    "bom-word-joiner-and-white-space": "\ufeff \u2060\t\u200c\n\u200d",
    "one-zero-width-space": "\u200b",
}


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
async def test_content_of_invisible_characters_only_is_empty(gateway, text):
    await assert_refused_and_nothing_written(gateway, REMEMBER, remember_body(content=text), "content")


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
async def test_a_search_query_of_invisible_characters_only_is_empty(gateway, text):
    assert_refused(await send(gateway, SEARCH, search_body(query=text)), "query")


async def test_visible_text_with_a_zero_width_space_is_content(gateway):
    memory_id = await remember_settled(gateway, "Lena\u200b keeps bees", {"user_id": "zero-width"})
    assert (await gateway.get(f"/api/memory/{memory_id}")).status_code == 200


# -- "*" is reserved in scopes ------------------------------------------------------------------

@pytest.mark.parametrize("scope", [{"user_id": "*"}, {"agent_id": "*"}, {"run_id": "*"},
                                   {"user_id": "u1", "agent_id": "*"}],
                         ids=["user_id", "agent_id", "run_id", "agent_id-beside-a-user"])
async def test_a_wildcard_scope_id_is_a_422_everywhere(gateway, scope):
    where = [part for part, value in scope.items() if value == "*"][0]
    await assert_refused_and_nothing_written(gateway, REMEMBER, remember_body(scope=scope), where)
    assert_refused(await send(gateway, SEARCH, search_body(scope=scope)), where)
    assert_refused(await gateway.get(LIST, **scope), where)


# -- a modify (PATCH) that cannot be applied changes nothing ----------------------------------

@pytest.fixture(scope="module")
async def patched(gateway):
    """A memory to modify: its id."""
    return await remember_settled(gateway, "Lena's hives stand by the north wall", {"user_id": "patch-bounds"})


async def send_patch(app: App, memory_id: str, body) -> httpx.Response:
    return await app.http.patch(f"/api/memory/{memory_id}", content=json.dumps(body), headers=headers(app))


async def memory_state(app: App, memory_id: str) -> tuple[dict, int]:
    """The memory as read, and its number of history events."""
    memory = (await app.get(f"/api/memory/{memory_id}")).json()
    return memory, await app.count("SELECT count(*) FROM memory_history WHERE memory_id = $1", uuid.UUID(memory_id))


PATCH_REFUSED = {
    "content-over-32000-characters": ({"content": "x" * 32_001}, "content"),
    "content-of-invisible-characters": ({"content": "\u200b \u2060"}, "content"),
    "nul-in-content": ({"content": f"hives{NUL}"}, "content"),
    "lone-surrogate-in-content": ({"content": f"hives{HIGH}"}, "content"),
    "every-change-null": ({"content": None, "tags": None, "importance": None}, "at least one"),
    "no-change": ({}, "at least one"),
    "importance-as-text": ({"importance": "0.5"}, "importance"),
    "importance-above-1": ({"importance": 1.5}, "importance"),
    "pinned-as-text": ({"pinned": "yes"}, "pinned"),
    "65-tags": ({"tags": [f"t{i}" for i in range(65)]}, "tags"),
    "unknown-field": ({"colour": "amber"}, "colour"),
    "version-0": ({"tags": ["x"], "if_version": 0}, "if_version"),
}


@pytest.mark.parametrize("body, where", PATCH_REFUSED.values(), ids=PATCH_REFUSED.keys())
async def test_a_modify_that_cannot_be_applied_is_a_422_and_changes_nothing(gateway, patched, body, where):
    before = await memory_state(gateway, patched)
    assert_refused(await send_patch(gateway, patched, {"reason": "bounds", **body}), where)
    assert await memory_state(gateway, patched) == before


async def test_a_modify_to_content_of_exactly_32000_characters_is_applied(gateway):
    memory_id = await remember_settled(gateway, "Lena's longest note", {"user_id": "patch-longest"})
    response = await send_patch(gateway, memory_id, {"content": "y" * 32_000, "reason": "the longest allowed"})
    assert response.status_code == 200, response.text[:500]
    assert response.json()["content"] == "y" * 32_000 and response.json()["version"] == 2


# -- a body that is no JSON object --------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b'{"content": ', b'{"content": "\xff", "scope": {"user_id": "u1"}}', b"\xff\xfe{}", b"", b"   ",
    b'[{"content": "Lena keeps bees", "scope": {"user_id": "u1"}}]', b'"Lena keeps bees"', b"null",
], ids=["truncated-json", "invalid-utf-8-in-a-string", "invalid-utf-8-prefix", "empty", "white-space-only",
        "array", "string", "null"])
@pytest.mark.parametrize("path", [REMEMBER, SEARCH, KEYS], ids=["remember", "search", "keys"])
async def test_a_body_that_is_no_json_object_is_a_422_and_writes_nothing(gateway, path, body):
    await assert_refused_and_nothing_written(gateway, path, body)


def test_the_blank_character_ranges_are_exactly_the_invisible_unicode_categories():
    """engram.domain.text writes the ranges out (so the OpenAPI schema states the same rule);
    a Python upgrade with new Unicode data must fail here, not drift."""
    import sys
    import unicodedata

    from engram.domain.text import BLANK_RANGES

    written = {cp for low, high in BLANK_RANGES for cp in range(low, high + 1)}
    derived = {cp for cp in range(sys.maxunicode + 1)
               if unicodedata.category(chr(cp)) in {"Cc", "Cf", "Zs", "Zl", "Zp"}} | {0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800}
    assert written == derived, (sorted(written - derived)[:10], sorted(derived - written)[:10])
