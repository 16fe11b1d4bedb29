"""A scripted stand-in for an LLM server, speaking both Ollama's and OpenAI's HTTP APIs.

It runs uvicorn on 127.0.0.1 in a background thread, so the real `ollama` and `openai`
client libraries reach it over real loopback HTTP. Chat requests are answered from a FIFO
script of `FakeReply`s, then from `default`; every request is recorded.

Decision requests (the write pipeline's: their JSON schema asks for `decisions`) have their
own script too, then `decision_default`; unscripted, every fact shown is an ADD.

Embedding requests (`/api/embed`, `/v1/embeddings`) have their own script, so they never take
a reply meant for a chat. Unscripted, they answer with `fake_embedding(text)`: a hashed bag of
words, not normalised (as from a server that leaves that to the client), so texts sharing
words point the same way. A model outside `embedding_models` gets the API's "not found" 404.

    with FakeLLMServer() as server:
        server.script(FakeReply.json({...}), FakeReply.status(500))
        OllamaProvider(url=server.url, ...)
        OpenAIProvider(base_url=server.openai_base_url, ...)
        server.requests[-1].body["messages"]
        server.script_embeddings(FakeReply.status(500))

Simulate a provider that is down by pointing a client at a closed port, not at this server.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

CREATED_AT = "2025-01-01T00:00:00Z"
CREATED = 1735689600
EMPTY_EXTRACTION: dict[str, Any] = {"facts": [], "entities": [], "category": None, "tags": []}
EMBEDDING_DIM = 64


def fake_embedding(text: str) -> list[float]:
    """Word counts hashed into EMBEDDING_DIM buckets: deterministic, and similar for texts sharing words."""
    vector = [0.0] * EMBEDDING_DIM
    for word in re.findall(r"\w+", text.lower()) or [text]:
        vector[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % EMBEDDING_DIM] += 1.0
    return vector


@dataclass(frozen=True)
class FakeReply:
    """One scripted answer to a chat request. Build it with the class methods."""

    content: str | None = None  # the model's message content
    http_status: int = 200
    delay_s: float = 0.0
    refusal: str | None = None  # OpenAI's message.refusal
    raw_body: str | None = None  # replaces the whole HTTP body
    finish_reason: str = "stop"

    @classmethod
    def json(cls, answer: Any, **kwargs: Any) -> FakeReply:
        """The model answers with `answer` serialised as JSON."""
        return cls(content=json.dumps(answer), **kwargs)

    @classmethod
    def malformed(cls, text: str = "not json {") -> FakeReply:
        """The model answers with text that is not the JSON it was asked for."""
        return cls(content=text)

    @classmethod
    def hallucinated(cls) -> FakeReply:
        """Valid JSON with fields and ids the contract never asked for."""
        return cls.json(
            {
                "id": "mem_42",
                "facts": [
                    {
                        "id": 7,
                        "content": "User likes green tea",
                        "type": "preference",
                        "confidence": 0.8,
                        "source_memory_id": "mem_1",
                    }
                ],
                "entities": [],
                "category": "food",
                "tags": ["tea"],
                "delete_memory_ids": ["mem_1", "mem_2"],
            }
        )

    @classmethod
    def decisions(cls, *decisions: dict[str, Any], **kwargs: Any) -> FakeReply:
        """A decision answer: each dict's missing fields default to an ADD of fact 1."""
        base = {"fact": 1, "action": "ADD", "target": None, "content": None, "confidence": 0.9, "reason": "scripted"}
        return cls.json({"decisions": [base | d for d in decisions]}, **kwargs)

    @classmethod
    def delay(cls, seconds: float, then: FakeReply | None = None) -> FakeReply:
        """Wait `seconds` before answering (with `then`, or an empty extraction)."""
        reply = then or cls.json(EMPTY_EXTRACTION)
        return replace(reply, delay_s=seconds)

    @classmethod
    def status(cls, code: int, message: str = "scripted failure") -> FakeReply:
        """An HTTP error status with the API's error body."""
        return cls(content=message, http_status=code)

    @classmethod
    def refused(cls, text: str = "I can't help with that.") -> FakeReply:
        """An OpenAI refusal (no content). Ollama has no refusal field and gets empty content."""
        return cls(content=None, refusal=text)

    @classmethod
    def broken_body(cls, text: str = "<html>502 Bad Gateway</html>") -> FakeReply:
        """A 200 whose body is not JSON at all, as from a misbehaving proxy."""
        return cls(raw_body=text)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    body: Any  # parsed JSON, or None
    headers: dict[str, str] = field(default_factory=dict)


class FakeLLMServer:
    """Scripted Ollama + OpenAI server on an OS-chosen loopback port. Thread-safe."""

    def __init__(
        self,
        models: tuple[str, ...] = ("llama3.2:3b", "gpt-4o-mini"),
        embedding_models: tuple[str, ...] = ("nomic-embed-text", "text-embedding-3-small"),
    ) -> None:
        self.models = list(models)
        self.embedding_models = list(embedding_models)
        self.default = FakeReply.json(EMPTY_EXTRACTION)
        self.delay_all = 0.0
        self._lock = threading.Lock()
        self._script: deque[FakeReply] = deque()
        self._embedding_script: deque[FakeReply] = deque()
        self._decision_script: deque[FakeReply] = deque()
        self.decision_default: FakeReply | None = None
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path in ("/api/chat", "/v1/chat/completions")]

    def embedding_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path in ("/api/embed", "/v1/embeddings")]

    def script(self, *replies: FakeReply) -> None:
        """Queue answers for the next chat requests, in order."""
        with self._lock:
            self._script.extend(replies)

    def decision_requests(self) -> list[RecordedRequest]:
        return [r for r in self.chat_requests() if _asks_for_decisions(r.body)]

    def script_decisions(self, *replies: FakeReply) -> None:
        """Queue answers for the next decision requests, in order."""
        with self._lock:
            self._decision_script.extend(replies)

    def script_embeddings(self, *replies: FakeReply) -> None:
        """Queue answers for the next embedding requests, in order. Only a reply's
        `http_status`, `content` (the error message), `delay_s` and `raw_body` are used."""
        with self._lock:
            self._embedding_script.extend(replies)

    def reset(self) -> None:
        """Forget both scripts, the recorded requests, the default and delay_all."""
        with self._lock:
            self._script.clear()
            self._embedding_script.clear()
            self._decision_script.clear()
            self._requests.clear()
            self.default = FakeReply.json(EMPTY_EXTRACTION)
            self.decision_default = None
            self.delay_all = 0.0

    def _next_reply(self, body: Any) -> FakeReply:
        with self._lock:
            if _asks_for_decisions(body):
                if self._decision_script:
                    return self._decision_script.popleft()
                return self.decision_default or _add_every_fact(body)
            return self._script.popleft() if self._script else self.default

    def _next_embedding_reply(self) -> FakeReply | None:
        with self._lock:
            return self._embedding_script.popleft() if self._embedding_script else None

    def _embeddings(self, body: dict) -> list[list[float]]:
        texts = body.get("input", "")
        return [fake_embedding(t) for t in ([texts] if isinstance(texts, str) else texts)]

    async def _record(self, request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            self._requests.append(RecordedRequest(request.method, request.url.path, body, dict(request.headers)))
        return body

    async def _sleep(self, seconds: float) -> None:
        # Wakes early on stop(), so a scripted delay never holds up shutdown.
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(0.02, left))

    # -- Ollama ---------------------------------------------------------------------------------

    async def _ollama_chat(self, request: Request) -> Response:
        body = await self._record(request) or {}
        reply = self._next_reply(body)
        await self._sleep(self.delay_all + reply.delay_s)
        if reply.raw_body is not None:
            return PlainTextResponse(reply.raw_body)
        if reply.http_status >= 400:
            return JSONResponse({"error": reply.content}, status_code=reply.http_status)
        return JSONResponse(
            {
                "model": body.get("model", ""),
                "created_at": CREATED_AT,
                "message": {"role": "assistant", "content": reply.content or ""},
                "done": True,
                "done_reason": "length" if reply.finish_reason == "length" else "stop",
                "total_duration": 1_000_000,
                "prompt_eval_count": 10,
                "eval_count": 10,
            }
        )

    async def _ollama_tags(self, request: Request) -> Response:
        await self._record(request)
        await self._sleep(self.delay_all)
        models = [
            {
                "name": name,
                "model": name,
                "modified_at": CREATED_AT,
                "size": 2_000_000_000,
                "digest": "0" * 64,
                "details": {"format": "gguf", "family": "llama", "parameter_size": "3B"},
            }
            for name in self.models
        ]
        return JSONResponse({"models": models})

    async def _ollama_version(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse({"version": "0.6.0"})

    async def _ollama_embed(self, request: Request) -> Response:
        body = await self._record(request) or {}
        reply = self._next_embedding_reply() or FakeReply()
        await self._sleep(self.delay_all + reply.delay_s)
        if reply.raw_body is not None:
            return PlainTextResponse(reply.raw_body)
        if reply.http_status >= 400:
            return JSONResponse({"error": reply.content}, status_code=reply.http_status)
        model = body.get("model", "")
        served = {m if ":" in m else f"{m}:latest" for m in self.embedding_models}
        if (model if ":" in model else f"{model}:latest") not in served:
            return JSONResponse({"error": f'model "{model}" not found, try pulling it first'}, status_code=404)
        return JSONResponse(
            {
                "model": model,
                "embeddings": self._embeddings(body),
                "total_duration": 1_000_000,
                "load_duration": 1_000,
                "prompt_eval_count": 10,
            }
        )

    # -- OpenAI ---------------------------------------------------------------------------------

    async def _openai_chat(self, request: Request) -> Response:
        body = await self._record(request) or {}
        reply = self._next_reply(body)
        await self._sleep(self.delay_all + reply.delay_s)
        if reply.raw_body is not None:
            return PlainTextResponse(reply.raw_body)
        if reply.http_status >= 400:
            error = {"message": reply.content, "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=reply.http_status)
        with self._lock:
            number = len(self._requests)
        return JSONResponse(
            {
                "id": f"chatcmpl-fake-{number}",
                "object": "chat.completion",
                "created": CREATED,
                "model": body.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply.content, "refusal": reply.refusal},
                        "logprobs": None,
                        "finish_reason": reply.finish_reason,
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        )

    async def _openai_embeddings(self, request: Request) -> Response:
        body = await self._record(request) or {}
        reply = self._next_embedding_reply() or FakeReply()
        await self._sleep(self.delay_all + reply.delay_s)
        if reply.raw_body is not None:
            return PlainTextResponse(reply.raw_body)
        if reply.http_status >= 400:
            error = {"message": reply.content, "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=reply.http_status)
        model = body.get("model", "")
        if model not in self.embedding_models:
            error = {
                "message": f"The model `{model}` does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
            return JSONResponse({"error": error}, status_code=404)
        vectors: list[Any] = self._embeddings(body)
        if body.get("encoding_format") == "base64":
            # The openai client asks for base64 (little-endian float32) unless told otherwise.
            vectors = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() for v in vectors]
        return JSONResponse(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
                "model": model,
                "usage": {"prompt_tokens": 10, "total_tokens": 10},
            }
        )

    async def _openai_models(self, request: Request) -> Response:
        await self._record(request)
        await self._sleep(self.delay_all)
        data = [{"id": name, "object": "model", "created": CREATED, "owned_by": "fake"} for name in self.models]
        return JSONResponse({"object": "list", "data": data})

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        """Bind a free loopback port, serve in a background thread, return once accepting."""
        app = Starlette(
            routes=[
                Route("/api/chat", self._ollama_chat, methods=["POST"]),
                Route("/api/tags", self._ollama_tags, methods=["GET"]),
                Route("/api/version", self._ollama_version, methods=["GET"]),
                Route("/api/embed", self._ollama_embed, methods=["POST"]),
                Route("/v1/chat/completions", self._openai_chat, methods=["POST"]),
                Route("/v1/embeddings", self._openai_embeddings, methods=["POST"]),
                Route("/v1/models", self._openai_models, methods=["GET"]),
            ]
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 5
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("fake LLM server did not start")
            time.sleep(0.005)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._stopping.set()
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _asks_for_decisions(body: Any) -> bool:
    """A chat request for the write pipeline's decisions: Ollama's `format` or OpenAI's
    `json_schema` has a `decisions` property."""
    if not isinstance(body, dict):
        return False
    schema = body.get("format")
    if not isinstance(schema, dict):
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    return isinstance(schema, dict) and "decisions" in (schema.get("properties") or {})


def _add_every_fact(body: dict) -> FakeReply:
    text = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
    facts = sorted({int(n) for n in re.findall(r'<fact id="(\d+)">', text)})
    return FakeReply.decisions(*({"fact": n} for n in facts))
