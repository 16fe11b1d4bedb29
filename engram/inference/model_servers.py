"""How Engram reaches a model server, for an LLM provider or a remote embedder alike: which
hosts memory text may reach (`check_endpoint`: ENGRAM_LOCAL_ONLY and the allowlist), one client
per library with its own retries, proxies and redirects off (Temporal owns retries), and one
reading of each library's exceptions as a `ProviderError` with a code the caller can act on.
"""

from __future__ import annotations

import ipaddress
import json
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from engram.domain.errors import ConfigError
from engram.settings import Settings

if TYPE_CHECKING:  # the clients are imported where they are made: openai alone takes ~0.5 s, at every start
    import ollama
    import openai

ErrorCode = Literal["unreachable", "timeout", "malformed_output", "http_error", "refused"]


class ProviderError(Exception):
    """One provider failed one call.

    `code` says what kind of failure it was: "unreachable" (connection refused, DNS),
    "timeout", "http_error" (a non-2xx answer), "malformed_output" (the answer is not the JSON
    the contract asks for) or "refused" (the model declined).
    """

    def __init__(self, provider: str, code: ErrorCode, detail: str, *, status: int | None = None) -> None:
        super().__init__(provider, code, detail)
        self.provider = provider
        self.code = code
        self.detail = detail
        self.status = status  # the HTTP status of an "http_error"

    @property
    def permanent(self) -> bool:
        """The server refused this very request's content (400, 413, 414, 422: malformed, too
        long): sending it again cannot succeed. A bad key, a billing stop or a model not pulled
        (401, 402, 403, 404) is an outage of the server's setup, retried until it is fixed."""
        return self.status in (400, 413, 414, 422)

    def __str__(self) -> str:
        return f"{self.provider}: {self.code}: {self.detail}"


def ollama_failure(exc: BaseException, url: str, timeout_s: float) -> ProviderError | None:
    """The `ProviderError` for an exception out of the ollama client, or None if it is not one of its failures."""
    name = "ollama"
    # The builtin TimeoutError (from asyncio.timeout) subclasses OSError, so it goes before ConnectionError.
    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return ProviderError(name, "timeout", f"no answer from {url} within {timeout_s}s")
    # The ollama client turns httpx.ConnectError (refused, DNS) into the builtin ConnectionError
    # and drops the cause, so the URL is all there is to report.
    if isinstance(exc, ConnectionError):
        return ProviderError(name, "unreachable", f"cannot connect to {url}")
    if isinstance(exc, httpx.TransportError):
        return ProviderError(name, "unreachable", f"connection to {url} failed: {type(exc).__name__}: {exc}")
    import ollama  # loaded with the client that raised it

    if isinstance(exc, ollama.ResponseError):
        return ProviderError(name, "http_error", f"HTTP {exc.status_code}: {exc.error}", status=exc.status_code)
    # A 2xx body that is not JSON, or not a chat/tags response.
    if isinstance(exc, (json.JSONDecodeError, ValidationError)):
        return ProviderError(name, "malformed_output", f"response body is not an Ollama response: {exc}")
    return None


def ollama_client(url: str, timeout_s: float) -> ollama.AsyncClient:
    """The Ollama client every model call uses (LLM and embeddings).

    No proxy from the environment and no redirects: either could carry memory text to a host
    that the endpoint checks never saw. Temporal owns retries, so the client makes none.
    """
    import ollama

    return ollama.AsyncClient(host=url, timeout=timeout_s, trust_env=False, follow_redirects=False)


def openai_client(base_url: str, api_key: str, timeout_s: float) -> openai.AsyncOpenAI:
    """The OpenAI-compatible client every model call uses: no retries, no proxy, no redirects."""
    import openai

    return openai.AsyncOpenAI(
        base_url=base_url,
        # Local servers need no key, but the client refuses to start without one.
        api_key=api_key or "unused",
        max_retries=0,
        timeout=timeout_s,
        http_client=openai.DefaultAsyncHttpx2Client(timeout=timeout_s, trust_env=False, follow_redirects=False),
    )


def openai_failure(exc: BaseException, url: str, timeout_s: float) -> ProviderError | None:
    """The `ProviderError` for an exception out of the openai client, or None if it is not one of its failures."""
    import openai  # loaded with the client that raised it

    name = "openai"
    # APITimeoutError subclasses APIConnectionError, so it goes first.
    if isinstance(exc, (TimeoutError, openai.APITimeoutError)):
        return ProviderError(name, "timeout", f"no answer from {url} within {timeout_s}s")
    if isinstance(exc, openai.APIConnectionError):
        cause = f"{type(exc.__cause__).__name__}: {exc.__cause__}" if exc.__cause__ else exc.message
        return ProviderError(name, "unreachable", f"cannot connect to {url}: {cause}")
    if isinstance(exc, openai.APIStatusError):
        return ProviderError(name, "http_error", f"HTTP {exc.status_code}: {exc.message}", status=exc.status_code)
    # A 2xx body labelled JSON that is not.
    if isinstance(exc, (json.JSONDecodeError, openai.APIResponseValidationError)):
        return ProviderError(name, "malformed_output", f"response body is not an OpenAI response: {exc}")
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        # Any other name could resolve anywhere, and resolve differently tomorrow.
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def check_endpoint(settings: Settings, provider: str, url: str) -> None:
    """Raise ConfigError unless `url` is a usable address that local_only and the allowlist permit."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"the {provider} provider URL {url!r} is not a valid URL: {exc}") from exc
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"the {provider} provider URL {url!r} must be an http:// or https:// URL with a host")

    if settings.local_only and not is_loopback(host):
        raise ConfigError(
            f"local_only is on, so the {provider} provider may only use a loopback host "
            f"(127.0.0.0/8, ::1, localhost), not {host!r} from {url!r}; "
            "set ENGRAM_LOCAL_ONLY=false to send memory text to another host"
        )
    if settings.provider_allowlist:
        shown = f"[{host}]" if ":" in host else host
        allowed = {entry.strip().lower() for entry in settings.provider_allowlist}
        if not allowed & {host, shown, f"{shown}:{port}"}:
            raise ConfigError(
                f"the {provider} provider host {shown}:{port} (from {url!r}) is not in "
                f"ENGRAM_PROVIDER_ALLOWLIST {sorted(allowed)}"
            )
