"""The HTTP gateway's OpenAPI schema is a contract the running service keeps.

schemathesis drives every operation of a live Engram (uvicorn on loopback, real Postgres and
Temporal) with the admin key, through all of its phases (examples, coverage, fuzzing,
stateful) with every check on: no server error; status codes, content types and bodies as
documented; schema-valid requests accepted; schema-invalid ones rejected; authentication
enforced; a 405 that names the allowed methods. Any finding fails, and the failure lists them
all. The plain assertions pin what the schema itself must say about auth, errors and limits.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import jsonschema_rs
import pytest
import schemathesis
from schemathesis.engine import Status, events, from_schema

from tests.conftest import serving

# Bounded and reproducible: the same requests on every run, so a finding in CI is one a
# developer sees again locally, and the run stays near a minute and a half on two cores.
MAX_EXAMPLES = 30
SEED = 20240601
MAX_SHOWN = 40

ERROR_BODY = {"error": {"type": "validation_error", "detail": "body: content: is empty"}}
FASTAPI_DEFAULT_422 = {"detail": [{"loc": ["body", "content"], "msg": "Field required", "type": "missing"}]}


# -- the schema says what is enforced -------------------------------------------------------

@pytest.fixture
async def openapi(app) -> dict:
    response = await app.get("/openapi.json")
    assert response.status_code == 200, response.text
    return response.json()


def api_operations(doc: dict) -> Iterator[tuple[str, dict]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if path.startswith("/api/") and method in {"get", "put", "post", "delete", "patch"}:
                yield f"{method.upper()} {path}", operation


def validator(doc: dict, schema: dict) -> jsonschema_rs.Validator:
    """`schema` as a validator whose `#/components/...` references resolve in `doc`."""
    return jsonschema_rs.Draft202012Validator({**schema, "components": doc["components"]})


def body_schema(doc: dict, path: str, method: str = "post") -> dict:
    return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def resolved(doc: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


async def test_every_api_operation_requires_a_bearer_token_or_an_api_key_header(openapi):
    schemes = openapi["components"].get("securitySchemes", {})
    bearer = {name for name, s in schemes.items() if s["type"] == "http" and s["scheme"].lower() == "bearer"}
    api_key = {name for name, s in schemes.items()
               if s["type"] == "apiKey" and s["in"] == "header" and s["name"].lower() == "x-api-key"}
    assert bearer and api_key, f"security schemes: {schemes}"
    for label, operation in api_operations(openapi):
        requirements = operation.get("security", openapi.get("security", []))
        assert {} not in requirements, f"{label}: an empty requirement makes auth optional"
        alternatives = {name for requirement in requirements for name in requirement}
        assert alternatives & bearer and alternatives & api_key, f"{label}: security {requirements}"


async def test_credentials_are_a_security_scheme_not_header_parameters(openapi):
    for path, item in openapi["paths"].items():
        operations = [operation for operation in item.values() if isinstance(operation, dict)]
        for parameter in item.get("parameters", []) + [p for op in operations for p in op.get("parameters", [])]:
            credential = parameter["name"].lower() in {"authorization", "x-api-key"}
            assert not (parameter["in"] == "header" and credential), f"{path}: header parameter {parameter['name']}"


async def test_every_api_operation_documents_401_and_422_with_the_error_body(openapi):
    for label, operation in api_operations(openapi):
        # 422 is bad input, so an operation that takes none (`GET /api/keys`) cannot answer it.
        takes_input = operation.get("parameters") or operation.get("requestBody")
        for status in ("401", "422") if takes_input else ("401",):
            assert status in operation["responses"], f"{label} does not document {status}"
            schema = operation["responses"][status]["content"]["application/json"]["schema"]
            check = validator(openapi, schema)
            assert check.is_valid(ERROR_BODY), f"{label} {status}: {schema}"
            assert not check.is_valid(FASTAPI_DEFAULT_422), f"{label} {status} admits FastAPI's default body"
            assert not check.is_valid({"error": {"type": "validation_error"}}), f"{label} {status}: detail optional"
    assert "HTTPValidationError" not in json.dumps(openapi)


async def test_schema_states_the_enforced_limits(openapi):
    search = resolved(openapi, body_schema(openapi, "/api/memory/search"))
    assert search["properties"]["limit"]["maximum"] == 100
    listing = {p["name"]: p["schema"] for p in openapi["paths"]["/api/memory"]["get"]["parameters"]}
    assert listing["limit"]["maximum"] == 100

    remember = validator(openapi, body_schema(openapi, "/api/memory/remember"))
    assert remember.is_valid({"content": "tea at five", "scope": {"user_id": "u1"}})
    assert not remember.is_valid({"content": "tea at five", "scope": {}}), "a scope needs one part"
    assert not remember.is_valid({"content": "tea at five", "scope": {"user_id": None}}), "a scope needs one part"
    assert not remember.is_valid({"content": "tea at five", "scope": {"user_id": "*"}}), "'*' is not a scope id"
    assert not remember.is_valid({"content": "x" * 32_001, "scope": {"user_id": "u1"}})

    keys = validator(openapi, body_schema(openapi, "/api/keys"))
    assert keys.is_valid({"name": "ci", "role": "reader", "scopes": ["user:u1", "agent:*"]})
    assert not keys.is_valid({"name": "ci", "role": "root", "scopes": ["*"]}), "role is an enum"
    assert not keys.is_valid({"name": "ci", "role": "reader", "scopes": ["team:t1"]}), "grants have a pattern"


# -- the live service keeps it --------------------------------------------------------------

# Rules JSON Schema cannot state, which the API answers with 422 as it should: a time phrase's
# grammar and a time_range whose start is after its end (search and list); a scope part among
# list's optional query parameters, and a cursor being only what a next_cursor gave (list); an
# `expires_at` that has passed (remember). Those operations alone may answer a schema-valid
# request with 422.
_ACCEPTED_OR_422 = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
_SEMANTIC_RULES = [
    {"include-path": path, "include-method": method,
     "checks": {"positive_data_acceptance": {"expected-statuses": _ACCEPTED_OR_422}}}
    for path, method in (("/api/memory/search", "POST"), ("/api/memory", "GET"), ("/api/memory/remember", "POST"))
] + [
    # Its coverage phase spent 80 of the run's 210 s generating boundary strings (a merge's
    # 32,000-character `content` under the visible-character pattern, in an anyOf with null);
    # its 50 fuzzed cases stay, and tests/test_reviews.py drives every resolution.
    {"include-path": "/api/reviews/{review_id}/resolve", "include-method": "POST",
     "phases": {"coverage": {"enabled": False}}},
    # The same for a modify: 136 of the run's 184 s went to drawing a 32,001-character `content`
    # once per branch of its body's anyOf (one field at least), character by character.
    # tests/test_bad_input.py drives its bounds: each refusal changes nothing.
    {"include-path": "/api/memory/{memory_id}", "include-method": "PATCH",
     "phases": {"coverage": {"enabled": False}}},
]


def schemathesis_config(base_url: str, key: str) -> schemathesis.Config:
    """What `schemathesis.toml` would hold, with this app's key. Every check is on with its
    default expected statuses, but for `_SEMANTIC_RULES`. `continue-on-failure` keeps an
    operation going past its first finding, so one run lists them all."""
    return schemathesis.Config.from_dict({
        "operations": _SEMANTIC_RULES,
        "seed": SEED,
        "base-url": base_url,
        "headers": {"Authorization": f"Bearer {key}"},
        "continue-on-failure": True,
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
        # A reproduction must be the request as sent: sanitizing would mask `idempotency_key`
        # in bodies too. The key it shows dies with this test's database.
        "output": {"sanitization": {"enabled": False}},
    })


@dataclass
class Run:
    findings: list[str]
    answered: set[str]  # operations that got a response
    refused: list[str]  # requests carrying the run's key that got a 401


def run_schemathesis(schema_url: str, base_url: str, key: str) -> Run:
    """Every phase against the live server, as `st run` would. Blocking (schemathesis sends
    with `requests`): run it off the server's event loop."""
    schema = schemathesis.openapi.from_url(schema_url, config=schemathesis_config(base_url, key))
    findings: dict[tuple, str] = {}
    answered: set[str] = set()
    refused: list[str] = []
    for event in from_schema(schema).execute():
        for identity, text in _findings(event):
            findings.setdefault(identity, text)
        if isinstance(event, events.ScenarioFinished):
            for case_id, interaction in event.recorder.interactions.items():
                if interaction.response is None:
                    continue
                answered.add(event.recorder.cases[case_id].value.operation.label)
                sent = {name.lower(): value for name, value in interaction.request.headers.items()}
                if interaction.response.status_code == 401 and sent.get("authorization") == [f"Bearer {key}"]:
                    refused.append(f"{interaction.request.method} {interaction.request.uri}")
    return Run(list(findings.values()), answered, refused)


def _findings(event: events.EngineEvent) -> Iterator[tuple[tuple, str]]:
    if isinstance(event, events.ScenarioFinished):
        for case_id, checks in event.recorder.checks.items():
            interaction = event.recorder.interactions.get(case_id)
            response = interaction.response if interaction is not None else None
            for check in checks:
                if check.status != Status.FAILURE or check.failure_info is None:
                    continue
                failure = check.failure_info.failure
                # A failure equals another of its kind on its operation (schemathesis' own
                # dedup); the answer splits further: a 422 for a NUL and one for a float limit
                # are two findings, a NUL in `tags[0]` and in `tags[3]` are one.
                identity = (failure, check.name, _answer_kind(response))
                got = f"\n  got: {response.status_code} {response.content[:400].decode(errors='replace')}" \
                    if response is not None else ""
                yield identity, (f"[{event.phase.value}] {check.name}: {failure.operation}: {failure}{got}"
                                 f"\n  reproduce: {check.failure_info.code_sample[:1500]}")
    elif isinstance(event, events.NonFatalError):
        yield ("error", event.label, event.info.title), f"[error] {event.label}: {event.info.format()}"
    elif isinstance(event, events.FatalError):
        yield ("fatal",), f"[fatal] {event.exception!r}"
    elif isinstance(event, events.EngineFinished):
        for failure in event.failures:
            yield (failure,), f"[after run] {failure}"


# What varies between answers of one kind: ids, quoted values, numbers, indices.
_VALUES = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|'[^']*'|\"[^\"]*\"|\d+")


def _answer_kind(response: schemathesis.Response | None) -> str:
    if response is None:
        return ""
    try:
        error = json.loads(response.content)["error"]
        detail = _VALUES.sub("_", str(error["detail"]))
        return f"{response.status_code} {error['type']} {detail}"
    except (ValueError, KeyError, TypeError):
        return str(response.status_code)


async def test_live_api_keeps_its_openapi_contract(app, openapi):
    async with serving(app) as base_url:
        run = await asyncio.to_thread(run_schemathesis, f"{base_url}/openapi.json", base_url, app.admin_key)
    operations = {f"{method.upper()} {path}" for path, item in openapi["paths"].items() for method in item}
    assert operations <= run.answered, f"never called: {operations - run.answered}"
    # Every check accepts a 401, so a run whose key stopped working (revoked by a fuzzed
    # DELETE, or read from the wrong header) would otherwise pass having tested nothing.
    assert not run.refused, f"the run's own key was refused {len(run.refused)} times, first: {run.refused[:3]}"
    if run.findings:
        shown = "\n\n".join(run.findings[:MAX_SHOWN])
        pytest.fail(f"{len(run.findings)} schemathesis findings (first {MAX_SHOWN}):\n\n{shown}", pytrace=False)
