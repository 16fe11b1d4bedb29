"""LLM providers: the transport that carries one extraction, or one rerank, to a model and back.

Two HTTP providers (Ollama, and any server that speaks the OpenAI chat API) sit behind one
protocol; `build_provider_chain` decides from the settings which of them Engram may talk to at
all, and `extract_with_chain` falls back from the preferred provider to the secondary.

What is asked and what is accepted (the prompt, the fence around the untrusted memory text,
the strict parsing of the answer) is the extraction contract in `engram.domain.extraction`; every
provider sends the same prompt and validates through it, so callers never see output the
validation rules would have dropped. A provider declared rerank-capable (`ENGRAM_LLM_RERANK`)
also scores passages against a query; that contract (prompt, fence, strict parsing) is below.

Retries belong to Temporal: the HTTP clients' own retries are off and every failure surfaces
at once as a `ProviderError` with a code the caller can act on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from engram.domain.errors import ConfigError
from engram.inference import local_llm
from engram.inference.model_servers import (
    ProviderError, check_endpoint, ollama_client, ollama_failure, openai_client, openai_failure,
)
from engram.logs import log_outbound
# The `X as X` names are not used here; they stay importable from this module, where they
# lived before the extraction contract moved out.
from engram.domain.extraction import (
    OUTPUT_SCHEMA,
    PROMPT_VERSION as PROMPT_VERSION,
    ExtractedEntity as ExtractedEntity,
    ExtractedFact as ExtractedFact,
    Extraction,
    MalformedOutput,
    build_messages,
    parse_extraction,
)
from engram.domain import decisions as decision_contract
from engram.domain.decisions import Decisions
from engram.domain.redaction import Redacted, redact
from engram.domain.relevance import RERANK_SCHEMA, parse_scores, rerank_messages
from engram.settings import Settings

log = logging.getLogger(__name__)

Stage = Literal["extract", "decide", "rerank"]
T = TypeVar("T")

# The health probe answers quickly or not at all: a readiness check must not hang for the
# full extraction timeout.
PROBE_TIMEOUT_S = 5.0

# Ollama's default context window (2048 or 4096 tokens, depending on the server version)
# silently drops the start of a long prompt, which is where the instructions are. Ask for a
# window that fits the prompt, a long memory and the answer.
OLLAMA_NUM_CTX = 8192
OUTPUT_TOKENS = 1024


class ProviderCapabilities(BaseModel):
    """What a provider can be asked to do, and within which limits."""

    model_config = ConfigDict(frozen=True)

    extraction: bool
    decision: bool
    rerank: bool
    timeout_s: float
    max_input_tokens: int
    max_output_tokens: int
    structured_output: Literal["json_schema", "json_mode", "prompt_only"]


class ProviderHealth(BaseModel):
    """A probe's answer. `latency_ms` is None when the provider did not answer at all."""

    name: str
    model: str
    ok: bool
    detail: str
    latency_ms: float | None


class ProviderChainError(Exception):
    """Every provider in the chain failed; `errors` holds one `ProviderError` per provider, in order."""

    def __init__(self, errors: list[ProviderError]) -> None:
        self.errors = list(errors)
        listed = "; ".join(f"{e.provider}: {e.code} ({e.detail})" for e in self.errors)
        super().__init__(f"all {len(self.errors)} LLM providers failed: {listed}")


class LLMProvider(Protocol):
    name: str
    model: str
    capabilities: ProviderCapabilities

    async def extract(self, text: str) -> Extraction:
        """Extract from `text`. Raises `ProviderError`; never returns unvalidated output."""
        ...

    async def decide(self, facts: list[str], memories: list[str], known: tuple[str, ...] = ()) -> Decisions:
        """Decisions about `facts` beside the existing `memories` (engram.domain.decisions);
        `known` secrets are redacted from both wherever they appear.
        Raises `ProviderError`, with code "malformed_output" for an answer that is not a
        decisions object; single decisions it cannot accept are dropped with a warning."""
        ...

    async def rerank(self, query: str, passages: list[str], known: tuple[str, ...] = ()) -> list[float]:
        """One relevance score from 0 to 10 per passage, in order (higher is more relevant).
        `known`: secrets the passages hold that no pattern may find (their memories' `sensitive`),
        redacted like the configured terms.

        Only valid when `capabilities.rerank`: the operator declares the model able to judge
        relevance. Raises `ProviderError`, with code "malformed_output" for an answer of the
        wrong length or with a score that is not a number from 0 to 10.
        """
        ...

    async def probe(self) -> ProviderHealth:
        """Report whether the provider answers and serves the model. Never raises."""
        ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# Shared by both providers.


def _parse(provider: LLMProvider, content: str, warnings: list[str]) -> Extraction:
    """`parse_extraction` for `provider`'s answer.

    Raises `ProviderError(code="malformed_output")`, with the contract's detail, for an answer
    the contract rejects, so the chain can try the next provider.
    """
    try:
        return parse_extraction(content, provider=provider.name, model=provider.model, warnings=warnings)
    except MalformedOutput as exc:
        raise ProviderError(provider.name, "malformed_output", str(exc)) from exc


_CALL_NAMES: dict[Stage, str] = {"extract": "llm extraction", "decide": "llm decision", "rerank": "llm rerank"}


def _decisions(provider: LLMProvider, content: str, facts: int, memories: int, warnings: list[str]) -> Decisions:
    try:
        return decision_contract.parse_decisions(content, facts=facts, memories=memories, provider=provider.name,
                                                 model=provider.model, warnings=warnings)
    except MalformedOutput as exc:
        raise ProviderError(provider.name, "malformed_output", str(exc)) from exc


class Redaction:
    """What a provider call sends instead of memory text: each secret replaced by a placeholder
    (engram.domain.redaction), with the map back kept here. `terms` are the operator's own
    sensitive words; `enabled` False sends text as it is."""

    def __init__(self, enabled: bool = True, terms: tuple[str, ...] = ()) -> None:
        self.enabled = enabled
        self.terms = terms

    def texts(self, texts: list[str], known: tuple[str, ...] = ()) -> tuple[list[str], Redacted]:
        """`texts` redacted together, so one secret has one placeholder wherever it appears;
        `known` are secrets found before (a fact's `sensitive`), redacted like terms."""
        if not self.enabled:
            return texts, Redacted(text="", secrets={})
        terms = self.terms + known
        # A NUL never occurs in stored text (the wire refuses it), and a line break ends every
        # value the patterns take, so this separates the texts.
        joined = redact(_SEPARATOR.join(texts), terms)
        parts = joined.text.split(_SEPARATOR)
        if len(parts) == len(texts):
            return parts, joined
        # A redaction ran over a separator (a private key block with no end line): one text at a
        # time. A placeholder two texts use for different secrets is then not restored: the
        # stored fact keeps the placeholder, and no secret leaves.
        one_by_one = [redact(t, terms) for t in texts]
        secrets: dict[str, str] = {}
        clashes: set[str] = set()
        for r in one_by_one:
            for placeholder, original in r.secrets.items():
                if secrets.setdefault(placeholder, original) != original:
                    clashes.add(placeholder)
        return ([r.text for r in one_by_one],
                Redacted(text="", secrets={k: v for k, v in secrets.items() if k not in clashes}))


NO_REDACTION = Redaction(enabled=False)
_SEPARATOR = "\n\x00\n"


def _restored(found: Extraction, redacted: Redacted) -> Extraction:
    """`found` with the originals back where the model copied placeholders."""
    if not redacted.secrets:
        return found
    back = redacted.restore
    return found.model_copy(update={
        "secrets": sorted(set(redacted.secrets.values())),
        "facts": [f.model_copy(update={"content": back(f.content)}) for f in found.facts],
        "entities": [e.model_copy(update={"source": back(e.source), "relationship": back(e.relationship),
                                          "target": back(e.target)}) for e in found.entities],
        "category": back(found.category) if found.category else found.category,
        "tags": [back(t) for t in found.tags],
    })


def _restored_decisions(found: Decisions, redacted: Redacted) -> Decisions:
    if not redacted.secrets:
        return found
    return found.model_copy(update={"secrets": sorted(set(redacted.secrets.values())), "decisions": [
        d.model_copy(update={"content": redacted.restore(d.content) if d.content else d.content,
                             "reason": redacted.restore(d.reason)}) for d in found.decisions]})


def _with_usage(result: T, tokens_in: int | None, tokens_out: int | None) -> T:
    """An extraction's or decisions' answer with the tokens the call took, as the server reported
    them (0 where it did not); a rerank's scores as they are."""
    if isinstance(result, (Extraction, Decisions)):
        return result.model_copy(update={"tokens_in": int(tokens_in or 0), "tokens_out": int(tokens_out or 0)})
    return result


def _scores(provider: LLMProvider, content: str, count: int) -> list[float]:
    try:
        return parse_scores(content, count)
    except MalformedOutput as exc:
        raise ProviderError(provider.name, "malformed_output", str(exc)) from exc


def _log_call(provider: LLMProvider, stage: Stage, started: float, outcome: str) -> None:
    log_outbound(log, _CALL_NAMES[stage], stage=stage, provider=provider.name, model=provider.model,
                 started=started, outcome=outcome)


def _cut_short(exc: ProviderError) -> ProviderError:
    # Output that stopped at the token limit is usually truncated JSON; say so, since the fix
    # (a larger limit) differs from that for a model that ignores the format.
    detail = f"{exc.detail} (the answer hit the {OUTPUT_TOKENS}-token output limit)"
    return ProviderError(exc.provider, exc.code, detail)


def _health(provider: LLMProvider, ok: bool, detail: str, started: float | None) -> ProviderHealth:
    latency = None if started is None else round((time.perf_counter() - started) * 1000, 1)
    return ProviderHealth(name=provider.name, model=provider.model, ok=ok, detail=detail, latency_ms=latency)


# ---------------------------------------------------------------------------------------------
# Ollama


def _ollama_model_name(name: str) -> str:
    # Ollama treats an untagged model name as ":latest".
    return name if ":" in name else f"{name}:latest"


class OllamaProvider:
    """A model served by Ollama's native API (`/api/chat`, `/api/tags`)."""

    name = "ollama"

    def __init__(self, *, url: str, model: str, timeout_s: float, rerank: bool = False,
                 redaction: Redaction = NO_REDACTION) -> None:
        self.url = url
        self._redaction = redaction
        self.model = model
        self.capabilities = ProviderCapabilities(
            extraction=True,
            decision=True,
            rerank=rerank,
            timeout_s=timeout_s,
            max_input_tokens=OLLAMA_NUM_CTX - OUTPUT_TOKENS,
            max_output_tokens=OUTPUT_TOKENS,
            structured_output="json_schema",
        )
        self._client = ollama_client(url, timeout_s)

    async def extract(self, text: str) -> Extraction:
        """See `LLMProvider.extract`."""
        (sent,), redacted = self._redaction.texts([text])
        messages, warnings = build_messages(sent, self.capabilities.max_input_tokens)
        found = await self._ask("extract", messages, OUTPUT_SCHEMA, lambda content: _parse(self, content, warnings))
        return _restored(found, redacted)

    async def decide(self, facts: list[str], memories: list[str], known: tuple[str, ...] = ()) -> Decisions:
        """See `LLMProvider.decide`."""
        sent, redacted = self._redaction.texts(facts + memories, known)
        messages, shown, warnings = decision_contract.build_messages(sent[:len(facts)], sent[len(facts):],
                                                                     self.capabilities.max_input_tokens)
        found = await self._ask("decide", messages, decision_contract.OUTPUT_SCHEMA,
                                lambda content: _decisions(self, content, len(facts), shown, warnings))
        return _restored_decisions(found, redacted)

    async def rerank(self, query: str, passages: list[str], known: tuple[str, ...] = ()) -> list[float]:
        """See `LLMProvider.rerank`."""
        sent, _ = self._redaction.texts([query, *passages], known)
        messages = rerank_messages(sent[0], sent[1:], self.capabilities.max_input_tokens)
        return await self._ask("rerank", messages, RERANK_SCHEMA,
                               lambda content: _scores(self, content, len(passages)))

    async def _ask(self, stage: Stage, messages: list[dict[str, str]], schema: dict,
                   parse: Callable[[str], T]) -> T:
        """Send `messages` asking for JSON matching `schema`, and return `parse` of the answer.

        The whole call is bounded by the provider's timeout and logged once with its outcome.
        Raises `ProviderError`: the transport's failures, or whatever `parse` raises for an
        answer it rejects (noting when the answer hit the output limit).
        """
        started = time.perf_counter()
        timeout_s = self.capabilities.timeout_s
        try:
            # httpx's timeout bounds each read, not the whole call; this bounds the whole call.
            async with asyncio.timeout(timeout_s):
                response = await self._client.chat(
                    model=self.model,
                    messages=messages,
                    format=schema,
                    stream=False,
                    options={"temperature": 0, "num_ctx": OLLAMA_NUM_CTX, "num_predict": OUTPUT_TOKENS},
                )
        except Exception as exc:
            failure = ollama_failure(exc, self.url, timeout_s)
            if failure is None:
                raise
            _log_call(self, stage, started, failure.code)
            raise failure from exc

        content = response.message.content or ""
        try:
            result = parse(content)
        except ProviderError as exc:
            _log_call(self, stage, started, exc.code)
            if response.done_reason == "length":
                raise _cut_short(exc) from exc
            raise
        _log_call(self, stage, started, "ok")
        return _with_usage(result, getattr(response, "prompt_eval_count", None), getattr(response, "eval_count", None))

    async def probe(self) -> ProviderHealth:
        """See `LLMProvider.probe`: asks `/api/tags` whether the model is pulled."""
        started = time.perf_counter()
        timeout_s = min(self.capabilities.timeout_s, PROBE_TIMEOUT_S)
        try:
            async with asyncio.timeout(timeout_s):
                listing = await self._client.list()
        # A probe reports every failure in its result; raising would turn "provider down" into
        # "health endpoint broken".
        except Exception as exc:
            failure = ollama_failure(exc, self.url, timeout_s)
            detail = f"{failure.code}: {failure.detail}" if failure else f"{type(exc).__name__}: {exc}"
            return _health(self, False, detail, None)
        served = sorted(_ollama_model_name(m.model) for m in listing.models if m.model)
        if _ollama_model_name(self.model) not in served:
            detail = f"model {self.model!r} is not pulled (run `ollama pull {self.model}`); served: {served}"
            return _health(self, False, detail, started)
        return _health(self, True, "model available", started)

    async def aclose(self) -> None:
        await self._client.close()


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible


class OpenAIProvider:
    """A model behind the OpenAI chat-completions API: OpenAI itself, vLLM, llama.cpp, LM Studio..."""

    name = "openai"

    def __init__(self, *, base_url: str, api_key: str, model: str, timeout_s: float,
                 rerank: bool = False, redaction: Redaction = NO_REDACTION, max_input_tokens: int = 16_384) -> None:
        self.base_url = base_url
        self._redaction = redaction
        self.model = model
        self.capabilities = ProviderCapabilities(
            extraction=True,
            decision=True,
            rerank=rerank,
            timeout_s=timeout_s,
            # By default what a small self-hosted server typically offers; OpenAI's own models allow more.
            max_input_tokens=max_input_tokens,
            max_output_tokens=OUTPUT_TOKENS,
            structured_output="json_schema",
        )
        self._client = openai_client(base_url, api_key, timeout_s)

    async def extract(self, text: str) -> Extraction:
        """See `LLMProvider.extract`. A refusal from the model raises code "refused"."""
        (sent,), redacted = self._redaction.texts([text])
        messages, warnings = build_messages(sent, self.capabilities.max_input_tokens)
        found = await self._ask("extract", messages, "extraction", OUTPUT_SCHEMA,
                                lambda content: _parse(self, content, warnings))
        return _restored(found, redacted)

    async def decide(self, facts: list[str], memories: list[str], known: tuple[str, ...] = ()) -> Decisions:
        """See `LLMProvider.decide`. A refusal from the model raises code "refused"."""
        sent, redacted = self._redaction.texts(facts + memories, known)
        messages, shown, warnings = decision_contract.build_messages(sent[:len(facts)], sent[len(facts):],
                                                                     self.capabilities.max_input_tokens)
        found = await self._ask("decide", messages, "decisions", decision_contract.OUTPUT_SCHEMA,
                                lambda content: _decisions(self, content, len(facts), shown, warnings))
        return _restored_decisions(found, redacted)

    async def rerank(self, query: str, passages: list[str], known: tuple[str, ...] = ()) -> list[float]:
        """See `LLMProvider.rerank`. A refusal from the model raises code "refused"."""
        sent, _ = self._redaction.texts([query, *passages], known)
        messages = rerank_messages(sent[0], sent[1:], self.capabilities.max_input_tokens)
        return await self._ask("rerank", messages, "rerank", RERANK_SCHEMA,
                               lambda content: _scores(self, content, len(passages)))

    async def _ask(self, stage: Stage, messages: list[dict[str, str]], schema_name: str, schema: dict,
                   parse: Callable[[str], T]) -> T:
        """Send `messages` asking for JSON matching `schema`, and return `parse` of the answer.

        The whole call is bounded by the provider's timeout and logged once with its outcome.
        Raises `ProviderError`: the transport's failures, a refusal, or whatever `parse` raises
        for an answer it rejects (noting when the answer hit the output limit).
        """
        started = time.perf_counter()
        timeout_s = self.capabilities.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                completion = await self._client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    # json_schema rather than json_object: LM Studio rejects json_object, and
                    # OpenAI, vLLM and llama.cpp accept both.
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": schema_name, "schema": schema, "strict": True},
                    },
                    temperature=0,
                    # max_tokens, not max_completion_tokens: the older name is the one every
                    # OpenAI-compatible server understands.
                    max_tokens=OUTPUT_TOKENS,
                )
        except Exception as exc:
            failure = openai_failure(exc, self.base_url, timeout_s)
            if failure is None:
                raise
            _log_call(self, stage, started, failure.code)
            raise failure from exc

        try:
            content = self._content(completion)
            result = parse(content)
        except ProviderError as exc:
            _log_call(self, stage, started, exc.code)
            if exc.code == "malformed_output" and _finish_reason(completion) == "length":
                raise _cut_short(exc) from exc
            raise
        _log_call(self, stage, started, "ok")
        usage = getattr(completion, "usage", None)
        return _with_usage(result, getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))

    def _content(self, completion: object) -> str:
        # The client builds response objects without validating them, and hands back plain
        # text when the body is not JSON, so nothing about the shape can be assumed.
        from openai.types.chat import ChatCompletion  # imported with the client (model_servers)

        if not isinstance(completion, ChatCompletion):
            detail = f"response body is not a chat completion: {str(completion)[:80]!r}"
            raise ProviderError(self.name, "malformed_output", detail)
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise ProviderError(self.name, "malformed_output", "chat completion has no choices")
        message = getattr(choices[0], "message", None)
        refusal = getattr(message, "refusal", None)
        if refusal or _finish_reason(completion) == "content_filter":
            raise ProviderError(self.name, "refused", str(refusal or "stopped by the content filter"))
        content = getattr(message, "content", None)
        if not isinstance(content, str):
            raise ProviderError(self.name, "malformed_output", "chat completion message has no text content")
        return content

    async def probe(self) -> ProviderHealth:
        """See `LLMProvider.probe`: asks `/models` whether the model is served."""
        started = time.perf_counter()
        timeout_s = min(self.capabilities.timeout_s, PROBE_TIMEOUT_S)
        try:
            async with asyncio.timeout(timeout_s):
                page = await self._client.models.list()
            served = sorted(str(getattr(m, "id", "")) for m in (getattr(page, "data", None) or []))
        # A probe reports every failure in its result, as for Ollama.
        except Exception as exc:
            failure = openai_failure(exc, self.base_url, timeout_s)
            detail = f"{failure.code}: {failure.detail}" if failure else f"{type(exc).__name__}: {exc}"
            return _health(self, False, detail, None)
        if self.model not in served:
            return _health(self, False, f"model {self.model!r} is not served; served: {served}", started)
        return _health(self, True, "model available", started)

    async def aclose(self) -> None:
        await self._client.close()


def _finish_reason(completion: object) -> str | None:
    choices = getattr(completion, "choices", None)
    if isinstance(choices, list) and choices:
        return getattr(choices[0], "finish_reason", None)
    return None


# ---------------------------------------------------------------------------------------------
# Which providers Engram may use, and the fallback between them.


def build_provider_chain(settings: Settings) -> list[LLMProvider]:
    """The providers to try, preferred first, from `llm_provider` then `llm_secondary`.

    "none" and a repeat of the preferred provider are skipped, so the chain may be empty:
    callers then save memories raw. The preferred provider declares the rerank capability when
    `llm_rerank` is set; the secondary never does. Raises ConfigError, at start-up, for a
    provider whose URL is malformed, is not loopback while `local_only` is on, or is missing
    from a non-empty `provider_allowlist`, and for an empty model name or a non-positive timeout.
    """
    if settings.llm_timeout_s <= 0:
        raise ConfigError(f"llm_timeout_s must be positive, not {settings.llm_timeout_s}")
    chain: list[LLMProvider] = []
    redaction = Redaction(settings.redact_outbound, tuple(settings.redact_terms))
    # dict.fromkeys drops a repeat while keeping the order; "none" matches neither branch.
    for name in dict.fromkeys((settings.llm_provider, settings.llm_secondary)):
        # llm_rerank vouches for the preferred provider's model only.
        rerank = settings.llm_rerank and name == settings.llm_provider
        if name == "ollama":
            if not settings.ollama_model:
                raise ConfigError("the ollama provider needs ENGRAM_OLLAMA_MODEL")
            check_endpoint(settings, name, settings.ollama_url)
            chain.append(
                OllamaProvider(url=settings.ollama_url, model=settings.ollama_model, timeout_s=settings.llm_timeout_s,
                               rerank=rerank, redaction=redaction)
            )
        elif name == "openai":
            if not settings.openai_model:
                raise ConfigError("the openai provider needs ENGRAM_OPENAI_MODEL")
            check_endpoint(settings, name, settings.openai_base_url)
            chain.append(
                OpenAIProvider(
                    base_url=settings.openai_base_url,
                    api_key=settings.openai_api_key,
                    model=settings.openai_model,
                    timeout_s=settings.llm_timeout_s,
                    rerank=rerank,
                    redaction=redaction,
                )
            )
        elif name == "local":
            # The model server `engram up` starts (engram.inference.local_llm): loopback, but held
            # to the allowlist like any other, since an operator who sets one lists every host.
            url = local_llm.base_url(settings.local_llm_port)
            check_endpoint(settings, name, url)
            chain.append(
                OpenAIProvider(base_url=url, api_key="local", model=local_llm.MODEL_NAME,
                               timeout_s=settings.llm_timeout_s, rerank=rerank, redaction=redaction,
                               max_input_tokens=local_llm.CONTEXT_TOKENS - OUTPUT_TOKENS)
            )
    return chain


async def extract_with_chain(chain: list[LLMProvider], text: str) -> Extraction:
    """Extract with the first provider in `chain` that succeeds.

    A success after earlier failures carries one warning per failed provider. Raises
    ValueError for an empty chain (callers skip extraction instead of calling this) and
    ProviderChainError, holding every provider's ProviderError in order, when all fail.
    Anything other than a ProviderError is a bug and propagates unchanged.
    """
    if not chain:
        raise ValueError("extract_with_chain needs at least one provider; skip extraction when the chain is empty")
    errors: list[ProviderError] = []
    for provider in chain:
        try:
            extraction = await provider.extract(text)
        except ProviderError as exc:
            log.warning(
                "llm provider failed, trying the next",
                extra={"provider": exc.provider, "model": provider.model, "outcome": exc.code, "detail": exc.detail},
            )
            errors.append(exc)
            continue
        return with_fallback_notes(extraction, errors, provider)
    raise ProviderChainError(errors)


Answer = TypeVar("Answer", Extraction, Decisions)


def with_fallback_notes(answer: Answer, errors: list[ProviderError], used: LLMProvider) -> Answer:
    """`answer` (an extraction or decisions) by `used`, with one warning per provider that failed before it."""
    if not errors:
        return answer
    notes = [f"provider {e.provider} failed ({e.code}: {e.detail}); used {used.name}" for e in errors]
    return answer.model_copy(update={"warnings": notes + answer.warnings})
