"""Remote embedders: a model served by Ollama (`/api/embed`) or by any server that speaks the
OpenAI embeddings API (`/v1/embeddings`), behind the local `Embedder`'s surface (`name`, `dim`,
`embed`, `embed_query`) so search and the remember activities use either without knowing which.
`open_embedder` picks one from the settings.

Memory text leaves the process, so the endpoint is held to `local_only` and
`provider_allowlist` by the same check as the LLM providers. As for them, retries belong to
Temporal: the HTTP clients' own retries are off and a failed call raises `EmbeddingUnavailable`
at once. Vectors are L2-normalised here, because not every server does it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import numpy as np

from engram.domain.errors import ConfigError, EmbeddingUnavailable
from engram.inference.embedder import Embedder, model_files
from engram.inference.model_servers import (
    ProviderError, check_endpoint, ollama_client, ollama_failure, openai_client, openai_failure,
)
from engram.logs import log_outbound
from engram.settings import Settings

log = logging.getLogger(__name__)

# Embedded once at open time to learn the model's dimension (and that it is served at all).
PROBE_TEXT = "Engram embedding probe."


class TextEmbedder(Protocol):
    """What search and the remember activities need from an embedder, local or remote."""

    name: str  # recorded with each memory as its embedding model
    dim: int

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Shape (len(texts), dim), float32, every row of unit length."""
        ...

    async def embed_query(self, query: str) -> np.ndarray: ...


class _RemoteEmbedder:
    """The shared contract; subclasses make the one HTTP call and read their client's errors."""

    provider: str
    open_hint: str

    def __init__(self, *, url: str, model: str, timeout_s: float) -> None:
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self.name = f"{self.provider}:{model}"
        self.dim = 0  # learned by `_learn_dim`, which `open` runs

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Vectors for `texts`, shape (len(texts), dim), float32, unit length.

        Raises EmbeddingUnavailable when the call fails or the answer is not len(texts) finite,
        non-zero vectors of `dim` numbers each.
        """
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                rows = await self._request(texts)
        except Exception as exc:
            failure = self._failure(exc)
            if failure is None:
                raise
            self._log(started, failure.code)
            raise EmbeddingUnavailable(f"{self.name}: {failure.code}: {failure.detail}",
                                       permanent=failure.permanent) from exc
        try:
            vectors = _unit_rows(rows, len(texts), self.dim)
        except ValueError as exc:
            self._log(started, "malformed_output")
            raise EmbeddingUnavailable(f"{self.name}: malformed_output: {exc}") from exc
        self._log(started, "ok")
        return vectors

    async def embed_query(self, query: str) -> np.ndarray:
        """One query's vector: the same as a document's, as no remote model gets an instruction."""
        return (await self.embed([query]))[0]

    async def _learn_dim(self) -> None:
        """Embed PROBE_TEXT once and keep its length as `dim`; ConfigError, with the client closed, if that fails."""
        try:
            self.dim = (await self.embed([PROBE_TEXT])).shape[1]
        except EmbeddingUnavailable as exc:
            await self.aclose()
            raise ConfigError(f"cannot open the embedder {exc.detail}; {self.open_hint}") from exc

    async def _request(self, texts: list[str]) -> Any:
        raise NotImplementedError

    def _failure(self, exc: BaseException) -> ProviderError | None:
        raise NotImplementedError

    def _log(self, started: float, outcome: str) -> None:
        log_outbound(log, "embedding", stage="embed", provider=self.provider, model=self.model, started=started,
                     outcome=outcome)


def _unit_rows(rows: Any, count: int, dim: int) -> np.ndarray:
    """`rows` as a float32 matrix of `count` unit rows; ValueError if it is not `count` finite,
    non-zero vectors of equal length (of length `dim`, once that is known)."""
    try:
        matrix = np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the vectors are not lists of numbers: {exc}") from exc
    if matrix.ndim != 2 or matrix.shape[0] != count or matrix.shape[1] == 0:
        raise ValueError(f"expected {count} vector(s), got an array of shape {matrix.shape}")
    if dim and matrix.shape[1] != dim:
        raise ValueError(
            f"the vectors have {matrix.shape[1]} dimensions, not the {dim} learned at start-up "
            "(has the server's model changed?)"
        )
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0):
        raise ValueError("a vector is all zeros or holds a non-finite number")
    return matrix / norms


class OllamaEmbedder(_RemoteEmbedder):
    """An embedding model served by Ollama's native API (`/api/embed`)."""

    provider = "ollama"

    def __init__(self, *, url: str, model: str, timeout_s: float) -> None:
        super().__init__(url=url, model=model, timeout_s=timeout_s)
        self.open_hint = f"is Ollama running at {url} with the model pulled (`ollama pull {model}`)?"
        self._client = ollama_client(url, timeout_s)

    @classmethod
    async def open(cls, *, url: str, model: str, timeout_s: float) -> "OllamaEmbedder":
        """An embedder whose `dim` is known. Raises ConfigError if the server is unreachable,
        the model is not pulled, or the answer is not a vector."""
        embedder = cls(url=url, model=model, timeout_s=timeout_s)
        await embedder._learn_dim()
        return embedder

    async def _request(self, texts: list[str]) -> Any:
        response = await self._client.embed(model=self.model, input=texts)
        return response.embeddings

    def _failure(self, exc: BaseException) -> ProviderError | None:
        return ollama_failure(exc, self.url, self.timeout_s)

    async def aclose(self) -> None:
        await self._client.close()


class OpenAIEmbedder(_RemoteEmbedder):
    """An embedding model behind the OpenAI embeddings API: OpenAI itself, vLLM, llama.cpp, LM Studio..."""

    provider = "openai"

    def __init__(self, *, base_url: str, api_key: str, model: str, timeout_s: float) -> None:
        super().__init__(url=base_url, model=model, timeout_s=timeout_s)
        self.open_hint = f"is the server at {base_url} running, and does it serve {model!r}?"
        self._client = openai_client(base_url, api_key, timeout_s)

    @classmethod
    async def open(cls, *, base_url: str, api_key: str, model: str, timeout_s: float) -> "OpenAIEmbedder":
        """An embedder whose `dim` is known. Raises ConfigError if the server is unreachable,
        does not serve the model, or answers with something that is not a vector."""
        embedder = cls(base_url=base_url, api_key=api_key, model=model, timeout_s=timeout_s)
        await embedder._learn_dim()
        return embedder

    async def _request(self, texts: list[str]) -> Any:
        response = await self._client.embeddings.create(
            model=self.model,
            input=texts,
            # The client asks for base64 unless told otherwise, which some OpenAI-compatible
            # servers do not speak; every one of them speaks float.
            encoding_format="float",
        )
        # The client does not validate the body (and returns plain text for a non-JSON one),
        # so nothing about its shape can be assumed.
        data = getattr(response, "data", None)
        if not isinstance(data, list):
            return None
        ordered = sorted(data, key=lambda item: getattr(item, "index", 0) or 0)
        return [getattr(item, "embedding", None) for item in ordered]

    def _failure(self, exc: BaseException) -> ProviderError | None:
        return openai_failure(exc, self.url, self.timeout_s)

    async def aclose(self) -> None:
        await self._client.close()


def configured_model(settings: Settings) -> str:
    """The embedding model the settings ask for, by the name memories record."""
    if settings.embedding_provider == "local":
        return settings.embedding_model
    if settings.embedding_provider == "ollama":
        return f"ollama:{settings.ollama_embedding_model}"
    return f"openai:{settings.openai_embedding_model}"


async def open_embedder(settings: Settings, model: str | None = None) -> TextEmbedder:
    """The embedder for `model` (a name memories record; default: the one the settings ask
    for), ready to use. Naming an old model lets a re-embed keep it serving while it runs.

    A local one loads off the event loop (ModelFileMismatch for a wrong file). A remote one
    must pass local_only and provider_allowlist before any request is sent, then embeds a probe
    text once to learn its dimension; each call is limited to llm_timeout_s. Raises ConfigError
    for a URL those settings refuse, an empty model name, a non-positive timeout, or a server
    that is unreachable or does not serve the model.
    """
    model = model or configured_model(settings)
    provider, _, remote_model = model.partition(":") if ":" in model else ("local", "", model)
    if provider == "local":
        return await asyncio.to_thread(Embedder.open, model_files(model), threads=settings.embedding_threads,
                                       nice=settings.embedding_nice, idle=settings.embedding_idle)
    if settings.llm_timeout_s <= 0:
        raise ConfigError(f"llm_timeout_s must be positive, not {settings.llm_timeout_s}")
    if not remote_model:
        raise ConfigError(f"the {provider} embedder needs ENGRAM_{provider.upper()}_EMBEDDING_MODEL")
    if provider == "ollama":
        check_endpoint(settings, "ollama embedding", settings.ollama_url)
        return await OllamaEmbedder.open(url=settings.ollama_url, model=remote_model, timeout_s=settings.llm_timeout_s)
    if provider != "openai":
        raise ConfigError(f"unknown embedding model {model!r}")
    check_endpoint(settings, "openai embedding", settings.openai_base_url)
    return await OpenAIEmbedder.open(
        base_url=settings.openai_base_url, api_key=settings.openai_api_key, model=remote_model,
        timeout_s=settings.llm_timeout_s,
    )
