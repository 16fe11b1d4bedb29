"""Choosing the embedder: the local ONNX model by default, or an Ollama / OpenAI-compatible one,
driven through the real `ollama` and `openai` clients over loopback HTTP to the fake server."""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio

from engram.domain.errors import ConfigError
from engram.domain.errors import EmbeddingUnavailable
from engram.inference.embedder import LOOP_TOKENISED_CHARS, Embedder
from engram.inference.remote_embedders import TextEmbedder, open_embedder
from engram.settings import Settings
from tests.conftest import app_settings, closed_port_url, new_database, running_app
from tests.fakes.llm_server import EMBEDDING_DIM, FakeLLMServer, FakeReply, fake_embedding

TIMEOUT_S = 5.0
MODELS = {"ollama": "nomic-embed-text", "openai": "text-embedding-3-small"}


def embedding_settings(kind: str, url: str, **overrides) -> Settings:
    """Settings for the `kind` embedder at `url` (a server root; OpenAI's base URL is derived)."""
    endpoint = {"ollama_url": url} if kind == "ollama" else {"openai_base_url": url + "/v1"}
    return Settings(**{"embedding_provider": kind, "llm_timeout_s": TIMEOUT_S, **endpoint, **overrides})


@pytest_asyncio.fixture(params=["ollama", "openai"])
async def remote(request: pytest.FixtureRequest, fake_llm: FakeLLMServer) -> AsyncIterator[TextEmbedder]:
    embedder = await open_embedder(embedding_settings(request.param, fake_llm.url))
    yield embedder
    await embedder.aclose()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)  # both unit length


async def test_remote_embedder_learns_its_dimension_from_a_probe_and_is_named_by_provider(remote, fake_llm):
    kind = remote.name.split(":")[0]
    assert remote.name == f"{kind}:{MODELS[kind]}"
    assert remote.dim == EMBEDDING_DIM
    [probe] = fake_llm.embedding_requests()
    assert probe.body["model"] == MODELS[kind]


async def test_remote_embedder_returns_unit_rows_normalised_client_side(remote, fake_llm):
    texts = ["green tea in the morning", "morning green tea", "the quarterly tax return deadline"]
    vectors = await remote.embed(texts)
    assert vectors.shape == (3, EMBEDDING_DIM) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    # The fake answers raw word counts, so unit rows mean the embedder normalised them.
    raw = np.asarray(fake_embedding(texts[0]))
    assert np.linalg.norm(raw) > 1.5
    np.testing.assert_allclose(vectors[0], raw / np.linalg.norm(raw), rtol=1e-5)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3
    assert fake_llm.embedding_requests()[-1].body["input"] == texts


async def test_remote_embed_query_is_the_document_vector(remote):
    query = await remote.embed_query("green tea")
    [document] = await remote.embed(["green tea"])
    assert query.shape == (EMBEDDING_DIM,)
    np.testing.assert_array_equal(query, document)


async def test_openai_embedder_sends_the_api_key(fake_llm):
    embedder = await open_embedder(embedding_settings("openai", fake_llm.url, openai_api_key="sk-test"))
    await embedder.aclose()
    assert fake_llm.embedding_requests()[0].headers["authorization"] == "Bearer sk-test"


@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_open_raises_config_error_when_the_server_is_unreachable(kind):
    with pytest.raises(ConfigError, match=f"cannot open the embedder {kind}:.*unreachable"):
        await open_embedder(embedding_settings(kind, closed_port_url()))


@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_open_raises_config_error_when_the_model_is_not_served(kind, fake_llm):
    overrides = {f"{kind}_embedding_model": "no-such-model"}
    with pytest.raises(ConfigError, match="no-such-model.*HTTP 404") as raised:
        await open_embedder(embedding_settings(kind, fake_llm.url, **overrides))
    if kind == "ollama":
        assert "ollama pull no-such-model" in str(raised.value)


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (FakeReply.status(500, "model crashed"), "http_error"),
        (FakeReply.broken_body(), "malformed_output"),
        (FakeReply.delay(3.0), "timeout"),
    ],
    ids=["http_500", "not_json", "slow"],
)
@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_failure_at_embed_time_raises_embedding_unavailable(kind, reply, code, fake_llm):
    # 1 s, not less: the call after the failure must connect and be answered within it on a
    # busy machine (at 0.3 s its connect alone once ran out).
    embedder = await open_embedder(embedding_settings(kind, fake_llm.url, llm_timeout_s=1.0))
    try:
        fake_llm.script_embeddings(reply)
        with pytest.raises(EmbeddingUnavailable, match=f"{kind}:{MODELS[kind]}: {code}") as raised:
            await embedder.embed(["green tea"])
        assert raised.value.http_status == 503 and raised.value.type == "embedding_unavailable"
        # The failure is per call: the next one succeeds.
        assert (await embedder.embed(["green tea"])).shape == (1, EMBEDDING_DIM)
    finally:
        await embedder.aclose()


@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_local_only_refuses_a_non_loopback_embedding_url(kind):
    with pytest.raises(ConfigError, match=f"local_only is on, so the {kind} embedding provider"):
        await open_embedder(embedding_settings(kind, "http://10.20.30.40:11434", local_only=True))


@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_allowlist_refuses_an_unlisted_host_before_sending_anything(kind, fake_llm):
    settings = embedding_settings(kind, fake_llm.url, provider_allowlist=["embeddings.internal"])
    with pytest.raises(ConfigError, match="not in ENGRAM_PROVIDER_ALLOWLIST"):
        await open_embedder(settings)
    assert fake_llm.requests == []


async def test_local_provider_is_the_default_and_opens_the_onnx_model():
    assert Settings().embedding_provider == "local"
    embedder = await open_embedder(Settings(embedding_provider="local", embedding_threads=1))
    assert isinstance(embedder, Embedder) and embedder.name == "bge-small-en-v1.5" and embedder.dim == 384


async def test_a_documents_vector_does_not_depend_on_what_it_is_embedded_with(embedder):
    """The int8 model scales a run's activations by the largest of them, so texts run beside
    each other would change each other's vectors: a memory remembered in a bulk import must
    get the vector it gets alone, and one that is the same on every re-embedding."""
    texts = ["Erin keeps bees on her rooftop", "ok", " ".join(["the hive swarmed in May"] * 12), "bees"]
    together = await embedder.embed(texts)
    alone = [embedder.embed_sync([text], parallel=False)[0] for text in texts]
    assert np.array_equal(together, np.stack(alone))
    assert np.array_equal(await embedder.embed(texts[::-1]), together[::-1])
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-6)


async def test_a_query_is_tokenised_in_the_callers_thread_and_gets_its_document_vector(embedder, monkeypatch):
    """A search tokenises its query on the event loop and sends only the model run to a thread;
    a query too long to tokenise there goes to the thread whole. Either way the vector is the
    one the same text, instruction first, gets as a document, bit for bit."""
    instructed = Embedder(dataclasses.replace(embedder.files, query_prefix="Represent this question: "),
                          embedder._session, embedder._tokenizer, threads=1)
    tokenizer, tokenised_in = embedder._tokenizer, []

    class Watched:
        def encode(self, text):
            tokenised_in.append(threading.current_thread().name)
            return tokenizer.encode(text)

        def encode_batch(self, texts):
            tokenised_in.append(threading.current_thread().name)
            return tokenizer.encode_batch(texts)

    short, long = "who keeps bees on a rooftop?", "who keeps bees? " * (LOOP_TOKENISED_CHARS // 10)
    expected = [instructed.embed_sync(["Represent this question: " + q], parallel=False)[0] for q in (short, long)]
    monkeypatch.setattr(instructed, "_tokenizer", Watched())
    assert np.array_equal(await instructed.embed_query(short), expected[0])
    assert tokenised_in == [threading.current_thread().name]
    assert np.array_equal(await instructed.embed_query(long), expected[1])
    assert tokenised_in[1] != threading.current_thread().name


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="per-thread nice and SCHED_IDLE are Linux features")
async def test_documents_embed_on_threads_nicer_than_the_caller_and_queries_in_the_callers_thread(monkeypatch):
    """A backlog's embedding yields the CPU to searches: its pool threads run EMBEDDING_NICE
    nicer than the process, under SCHED_IDLE; a query runs at the caller's priority and policy."""
    import onnxruntime

    def priority() -> tuple[int, int]:
        tid = threading.get_native_id()
        return os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)

    seen: dict[str, set[tuple[int, int]]] = {"document": set(), "query": set()}  # (nice, policy) by kind
    run = onnxruntime.InferenceSession.run

    def observed(session, *args, **kwargs):
        seen["query" if threading.current_thread().name.startswith("asyncio") else "document"].add(priority())
        return run(session, *args, **kwargs)

    monkeypatch.setattr(onnxruntime.InferenceSession, "run", observed)
    embedder = await open_embedder(Settings(embedding_provider="local", embedding_threads=2, embedding_nice=7))
    base, policy = priority()
    await embedder.embed([f"document {i} about bees" for i in range(40)])
    await embedder.embed_query("who keeps bees?")
    assert seen == {"document": {(min(base + 7, 19), os.SCHED_IDLE)}, "query": {(base, policy)}}

    seen = {"document": set(), "query": set()}
    plain = await open_embedder(Settings(embedding_provider="local", embedding_threads=2, embedding_nice=0,
                                         embedding_idle=False))
    await plain.embed(["one more document"])
    assert seen == {"document": {(base, policy)}, "query": set()}


@pytest_asyncio.fixture
async def ollama_embedded_app(postgres, temporal, reranker, fake_llm, tmp_path):
    """An Engram whose embedder is an Ollama model served by the fake server; no LLM."""
    settings = app_settings(
        tmp_path / uuid.uuid4().hex[:6], await new_database(postgres), temporal_address=temporal.address,
        embedding_provider="ollama", ollama_url=fake_llm.url, llm_provider="none",
    )
    # embedder=None: the runtime opens the embedder the settings name.
    async with running_app(settings, embedder=None, reranker=reranker) as app:
        yield app


async def test_service_with_ollama_embedder_records_the_model_and_finds_the_memory(ollama_embedded_app, fake_llm):
    app = ollama_embedded_app
    assert app.runtime.spaces.models == ["ollama:nomic-embed-text"]
    # The first embedding call fails; Temporal retries the activity.
    fake_llm.script_embeddings(FakeReply.status(500))
    answer = await app.remember("Erin keeps bees on her rooftop", mode="async")
    await app.wait_job(answer["job_id"], "done")
    memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
    assert memory["embedding_model"] == "ollama:nomic-embed-text"
    sent = [r.body["input"] for r in fake_llm.embedding_requests()]
    assert sent.count(["Erin keeps bees on her rooftop"]) == 2

    [hit] = await app.search("bees rooftop")
    assert hit["memory"]["id"] == answer["memory_id"]
    # A vector score exists only when the query's embedder made the memory's embedding.
    assert hit["components"]["vector"] > 0.5

    fake_llm.script_embeddings(FakeReply.status(500))
    response = await app.post("/api/memory/search", {"query": "bees", "scope": {"user_id": "u1"}})
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "embedding_unavailable"

    # Readiness says so, without taking the instance out: remember still saves.
    app.runtime.embedder_probe_ttl_s = 0
    fake_llm.script_embeddings(FakeReply.status(500))
    ready = await app.http.get("/readyz")
    assert ready.status_code == 200
    embedder = ready.json()["components"]["embedder"]
    assert embedder["reachable"] is False and "http_error" in embedder["probe"]
    assert (await app.http.get("/readyz")).json()["components"]["embedder"]["reachable"] is True
    # Within the probe's time to live, readiness answers without calling the embedder.
    app.runtime.embedder_probe_ttl_s = 30
    calls = len(fake_llm.embedding_requests())
    assert (await app.http.get("/readyz")).json()["components"]["embedder"]["reachable"] is True
    assert len(fake_llm.embedding_requests()) == calls


@pytest.mark.parametrize(("status", "permanent"), [
    (400, True), (413, True), (422, True),
    # The server's setup, not the text: a rotated key, a model not pulled, a rate limit.
    (401, False), (403, False), (404, False), (408, False), (429, False), (500, False), (503, False),
])
@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_only_a_refusal_of_the_text_itself_is_permanent(kind, status, permanent, fake_llm):
    embedder = await open_embedder(embedding_settings(kind, fake_llm.url))
    try:
        fake_llm.script_embeddings(FakeReply.status(status, "input is too long"))
        with pytest.raises(EmbeddingUnavailable) as raised:
            await embedder.embed(["a very long text"])
        assert raised.value.permanent is permanent
    finally:
        await embedder.aclose()


async def test_a_text_the_embedder_refuses_is_not_retried_and_stays_findable_by_bm25(ollama_embedded_app, fake_llm):
    app = ollama_embedded_app
    fake_llm.script_embeddings(FakeReply.status(400, "input length exceeds the context length"))
    answer = await app.remember("Gus repaired the lighthouse lamp in March", mode="async")
    job = await app.wait_job(answer["job_id"], "done")
    assert job["last_error_code"] == "EmbeddingRejected" and "context length" in job["last_error"]
    sent = [r.body["input"] for r in fake_llm.embedding_requests()]
    assert sent.count(["Gus repaired the lighthouse lamp in March"]) == 1
    memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
    assert memory["embedding_model"] is None

    [hit] = await app.search("lighthouse lamp")
    assert hit["memory"]["id"] == answer["memory_id"]
    assert hit["components"]["bm25"] > 0 and hit["components"]["vector"] == 0
