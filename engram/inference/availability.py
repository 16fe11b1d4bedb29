"""Which LLM providers are up, shared by every process through Postgres (provider_health).

An outage must cost O(1), not O(N): the first call that finds a provider down records it, and
from then on every process skips that provider without calling it, remember answers
`raw_saved` at once when the whole chain is down, and extractions park instead of retrying
each on its own timer. One watcher (the drain workflow) probes the down providers on a
backoff and records them up again. A change of state is logged once, by the process that
recorded it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from engram.domain.decisions import Decisions
from engram.domain.extraction import Extraction
from engram.inference.model_servers import ProviderError
from engram.inference.providers import LLMProvider, ProviderChainError, with_fallback_notes
from engram.store import provider_health

log = logging.getLogger(__name__)
T = TypeVar("T")


def provider_key(provider: LLMProvider) -> str:
    return f"{provider.name}/{provider.model}"


def is_outage(err: ProviderError) -> bool:
    """The provider, not this memory, is at fault: unreachable, too slow, or a server error
    (a 429 or 5xx; a bad key or a missing model, 401 to 404, too). A malformed answer, a
    refusal or a refused text (400, 413, 414, 422) is this memory's failure."""
    return err.code in ("unreachable", "timeout") or (err.code == "http_error" and not err.permanent)


@dataclass(frozen=True)
class ChainDown(Exception):
    """Every provider of the chain is known to be down; nothing was called."""

    detail: str

    def __str__(self) -> str:
        return self.detail


class Availability:
    """The chain's providers and what is known of each. Reads are cached for `refresh_s`;
    what this process records is seen by it at once."""

    def __init__(self, pool: asyncpg.Pool, chain: list[LLMProvider], refresh_s: float = 1.0) -> None:
        self._pool = pool
        self.chain = chain
        self._refresh_s = refresh_s
        self._down: dict[str, str] = {}  # provider key -> why
        self._read_at = float("-inf")
        self._reading = asyncio.Lock()

    async def _fresh(self) -> dict[str, str]:
        if time.monotonic() - self._read_at > self._refresh_s:
            async with self._reading:
                if time.monotonic() - self._read_at > self._refresh_s:
                    states = await provider_health.all_states(self._pool)
                    self._down = {k: s.detail or "down" for k, s in states.items() if s.state == "down"}
                    self._read_at = time.monotonic()
        return self._down

    async def usable(self) -> list[LLMProvider]:
        """The providers not known to be down, in chain order."""
        down = await self._fresh()
        return [p for p in self.chain if provider_key(p) not in down]

    async def chain_down(self) -> str | None:
        """Why extraction cannot run now (every provider is known to be down), or None. An
        empty chain is not down: it has nothing to run."""
        down = await self._fresh()
        if self.chain and all(provider_key(p) in down for p in self.chain):
            return "; ".join(f"{provider_key(p)}: {down[provider_key(p)]}" for p in self.chain)
        return None

    async def down(self) -> list[LLMProvider]:
        down = await self._fresh()
        return [p for p in self.chain if provider_key(p) in down]

    async def record(self, provider: LLMProvider, up: bool, detail: str) -> None:
        key = provider_key(provider)
        if up:
            self._down.pop(key, None)
        else:
            self._down[key] = detail
        if await provider_health.record(self._pool, key, "up" if up else "down", detail):
            if up:
                log.warning("llm provider is back", extra={"provider": provider.name, "model": provider.model,
                                                           "outcome": "up", "detail": detail})
            else:
                log.warning("llm provider is down; extractions park until it answers",
                            extra={"provider": provider.name, "model": provider.model, "outcome": "down",
                                   "detail": detail})

    async def extract(self, text: str) -> Extraction:
        """Extract with the first usable provider that succeeds, recording any that turns out to
        be down. Raises ChainDown when no provider is usable (nothing called), ProviderChainError
        when every usable provider failed."""
        found, errors, used = await self._first(lambda provider: provider.extract(text))
        return with_fallback_notes(found, errors, used)

    async def decide(self, facts: list[str], memories: list[str], known: tuple[str, ...] = ()) -> Decisions:
        """`extract`'s fallback and outage rules, for decisions about `facts` beside `memories`."""
        found, errors, used = await self._first(lambda provider: provider.decide(facts, memories, known))
        return with_fallback_notes(found, errors, used)

    async def _first(self, call: Callable[[LLMProvider], Awaitable[T]]) -> tuple[T, list[ProviderError], LLMProvider]:
        """`call` on each usable provider until one succeeds: (its answer, the earlier failures, it)."""
        usable = await self.usable()
        if not usable:
            raise ChainDown(await self.chain_down() or "every provider is down")
        errors: list[ProviderError] = []
        for provider in usable:
            try:
                found = await call(provider)
            except ProviderError as err:
                errors.append(err)
                if is_outage(err):
                    await self.record(provider, False, f"{err.code}: {err.detail}")
                continue
            return found, errors, provider
        raise ProviderChainError(errors)

    async def probe_down(self) -> list[str]:
        """Probe each provider known to be down and record the ones that answer. Returns what
        is still down ("<provider>: why")."""
        still = []
        for provider in await self.down():
            health = await provider.probe()
            await self.record(provider, health.ok, health.detail)
            if not health.ok:
                still.append(f"{provider_key(provider)}: {health.detail}")
        return still
