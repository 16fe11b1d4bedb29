"""`engram mcp`: Engram's memory tools for agents over the Model Context Protocol, served by the
official `mcp` SDK's MCPServer on stdio or streamable HTTP.

The server is an API client and nothing more. Each tool call is one call of
engram.client.AsyncEngram sent with `X-Engram-Client: mcp`: the HTTP API judges it (the key's
role and scope grants, the control switches) and records `path=mcp` on every history event.

Which key a tool call is sent with:
- stdio: the process's key: `--api-key`, else ENGRAM_API_KEY, else `$ENGRAM_DATA_DIR/api-key`.
- streamable HTTP: the key in the call's own HTTP request (`Authorization: Bearer <key>`), so
  agents with keys of their own can share one server. A request without one uses the key given
  as `--api-key` or ENGRAM_API_KEY. The data directory's key is never used here: that is the
  admin key `engram up` writes, and an HTTP port must not hand it to whoever connects. With
  neither, the call is refused `unauthenticated`. The key is read from each request and kept
  nowhere, so no session's key can serve another.

An error answer of the API becomes the tool's error result (`isError`), whose text carries the
API's error type and detail (`not_found: ...`); the session goes on.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shlex
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import Field

from api.mcp_schemas import (
    Filters, FiltersParam, ForgetResult, HistoryEventView, HistoryView, IfVersion, IncludeExpired,
    MemoryId, MemoryList, MemoryView, PreviewView, Query, ReasonParam, ScopeParam, SearchHitView, SearchResult,
    lean_schema,
)
from engram.client import ApiError, AsyncEngram, ConnectionFailed
from engram.client.wire import default_api_key, default_url
from engram.domain.forget import MAX_FORGET_IDS, ForgetPreview
from engram.domain.models import (
    MAX_LIMIT, MAX_QUERY_CHARS, Content, Label, Metadata, RememberResponse, Scope, ShortLabel, Tag,
    wire_int,
)
from engram.domain.provenance import MemoryType

CLIENT = "mcp"  # X-Engram-Client: history's `path` for every change made here

INSTRUCTIONS = """Engram is your long-term memory. Search it (memory_search) before answering \
from what you remember, store what is worth keeping (memory_store), and correct a memory with \
memory_modify rather than storing a contradiction. Every change needs a reason and is kept in \
the memory's history (memory_history). Forgetting one memory by id is a soft delete that can be \
recovered within the recovery window. Forgetting many (by query or filters) only ever previews: \
a person must confirm it, and an operator must approve large sets; you cannot."""


# -- keys -----------------------------------------------------------------------------------------

@dataclass
class Engrams:
    """The server's state while it runs: where the API is, the client of the configured key
    (None: every call must bring its own key) and the transport per-call clients use."""

    url: str
    default: AsyncEngram | None
    transport: httpx.AsyncBaseTransport | None


def _bearer(headers: Mapping[str, str] | None) -> str | None:
    """The key of a request's `Authorization: Bearer <key>`; None without the header. Raises
    ToolError for any other Authorization: falling back to the configured key then would act
    with a key the caller did not mean."""
    value = (headers or {}).get("authorization")
    if value is None:
        return None
    scheme, _, key = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ToolError("unauthenticated: the Authorization header must be 'Bearer <engram key>'")
    return key.strip()


@asynccontextmanager
async def _engram(ctx: Context) -> AsyncIterator[AsyncEngram]:
    """The client for this tool call: its request's bearer key, else the configured one. Raises
    ToolError `<type>: <detail>` for an API error or an API that cannot be reached."""
    state: Engrams = ctx.request_context.lifespan_context
    key = _bearer(ctx.headers)
    if key is None and state.default is None:
        raise ToolError("unauthenticated: no Engram key: send 'Authorization: Bearer <engram key>' "
                        "(or start the server with --api-key)")
    try:
        if key is None:
            yield state.default
        else:
            async with AsyncEngram(state.url, key, client=CLIENT, transport=state.transport) as engram:
                yield engram
    except ApiError as err:
        raise ToolError(f"{err.type}: {err.detail}") from err
    except ConnectionFailed as err:
        applied = " (the change may have been made: check before repeating it)" if err.maybe_applied else ""
        raise ToolError(f"unavailable: Engram at {state.url} could not be reached{applied}: {err}") from err


# -- the server -----------------------------------------------------------------------------------

def build_server(*, url: str, api_key: str | None, transport: httpx.AsyncBaseTransport | None = None) -> MCPServer:
    """The MCP server of the seven memory tools, calling the API at `url`. `api_key`: the key of
    calls that bring none (None: each must, as a bearer key). `transport`: an httpx transport
    for the API clients (`httpx.ASGITransport(app=...)` in tests). Connects to nothing until a
    session starts."""

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[Engrams]:
        default = AsyncEngram(url, api_key, client=CLIENT, transport=transport) if api_key else None
        try:
            yield Engrams(url=url, default=default, transport=transport)
        finally:
            if default is not None:
                await default.aclose()

    def changes(title: str, *, destructive: bool) -> ToolAnnotations:
        return ToolAnnotations(title=title, read_only_hint=False, destructive_hint=destructive, idempotent_hint=False,
                               open_world_hint=False)

    def reads(title: str) -> ToolAnnotations:
        return ToolAnnotations(title=title, read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    tools = [
        _tool(memory_search, reads("Search memories")),
        _tool(memory_store, changes("Store a memory", destructive=False)),
        _tool(memory_get, reads("Get a memory")),
        _tool(memory_list, reads("List memories")),
        # Destructive: a change replaces what recall returns (the old version stays in history).
        _tool(memory_modify, changes("Change a memory", destructive=True)),
        _tool(memory_forget, changes("Forget memories", destructive=True)),
        _tool(memory_history, reads("A memory's history")),
    ]
    return MCPServer("engram", title="Engram memory", instructions=INSTRUCTIONS, lifespan=lifespan, tools=tools)


def _tool(fn: Callable[..., Any], annotations: ToolAnnotations) -> Tool:
    """`fn` as a tool (its docstring, unwrapped, is the description the model reads), with an
    input schema lean of the wire's character checks (api.mcp_schemas.lean_schema)."""
    description = re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(fn.__doc__ or ""))
    tool = Tool.from_function(fn, description=description, annotations=annotations)
    tool.parameters = lean_schema(tool.parameters)
    return tool


# -- the tools: each one call of the API, its docstring the description the model reads ----------


async def memory_search(query: Query, scope: ScopeParam, ctx: Context,
                        limit: Annotated[wire_int(1, MAX_LIMIT), Field(description="At most this many")] = 10,
                        filters: FiltersParam = None, include_expired: IncludeExpired = False) -> SearchResult:
    """Find the memories of a scope that best answer a query (semantic and keyword search),
    best first, each with its score. Reads only."""
    async with _engram(ctx) as engram:
        found = await engram.search(query, scope=scope, limit=limit,
                                    filters=filters, include_expired=include_expired)
    return SearchResult(results=[SearchHitView(score=h.score, memory=MemoryView.of(h.memory))
                                 for h in found.results], warnings=found.warnings)


async def memory_store(
    content: Annotated[Content, Field(description="What to remember, as a self-contained statement")],
    scope: ScopeParam, ctx: Context,
    memory_type: Annotated[MemoryType | None, Field(description=(
        "FACT (default), PREFERENCE, DECISION, PATTERN, STATE, CONTEXT or LEARNED. PATTERN, CONTEXT, "
        "LEARNED and STATE expire after their lifetime; LEARNED waits for an operator's approval"))] = None,
    tags: Annotated[list[Tag] | None, Field(max_length=64, description="Labels to filter by later")] = None,
    source_type: Annotated[ShortLabel | None, Field(description=(
        "Where the content came from (user, agent, tool, web, document, ...): sets how far it is trusted"))] = None,
    session_id: Annotated[Label | None, Field(description="The conversation it came from")] = None,
    importance: Annotated[float, Field(ge=0.0, le=1.0, description="0 to 1")] = 0.5,
    confidence: Annotated[float, Field(ge=0.0, le=1.0, description="0 to 1: how sure the content is")] = 1.0,
    metadata: Annotated[Metadata | None, Field(description="Any JSON object to keep with it")] = None,
    idempotency_key: Annotated[Label | None, Field(description=(
        "The same key again stores nothing twice and answers as the first time"))] = None,
) -> RememberResponse:
    """Store a new memory in a scope. The answer's status says where it is: processed,
    queued (facts are extracted in the background), raw_saved, or pending_approval (it
    waits for an operator and is not recalled until then)."""
    fields = {"memory_type": memory_type, "tags": tags, "source_type": source_type, "session_id": session_id,
              "metadata": metadata}
    async with _engram(ctx) as engram:
        return await engram.remember(content, scope=scope, idempotency_key=idempotency_key,
                                     importance=importance, confidence=confidence,
                                     **{k: v for k, v in fields.items() if v is not None})


async def memory_get(id: MemoryId, ctx: Context) -> MemoryView:
    """One memory by its id. A memory of a scope the key may not see answers not_found."""
    async with _engram(ctx) as engram:
        return MemoryView.of(await engram.get(id))


async def memory_list(scope: ScopeParam, ctx: Context,
                      limit: Annotated[wire_int(1, MAX_LIMIT), Field(description="At most this many")] = 20,
                      cursor: Annotated[str | None, Field(max_length=500, description=(
                          "The previous page's next_cursor"))] = None,
                      filters: FiltersParam = None, include_expired: IncludeExpired = False) -> MemoryList:
    """A page of a scope's memories, newest first. Reads only."""
    async with _engram(ctx) as engram:
        page = await engram.list(scope=scope, cursor=cursor, limit=limit, include_expired=include_expired,
                                 **(filters.given() if filters else {}))
    return MemoryList(items=[MemoryView.of(m) for m in page.items], next_cursor=page.next_cursor)


async def memory_modify(
    id: MemoryId, reason: ReasonParam, ctx: Context,
    content: Annotated[Content | None, Field(description="The new text")] = None,
    tags: Annotated[list[Tag] | None, Field(max_length=64, description="The new tags (replace the old)")] = None,
    importance: Annotated[float | None, Field(ge=0.0, le=1.0, description="0 to 1")] = None,
    pinned: Annotated[bool | None, Field(description="Pinned memories are kept from bulk forgets")] = None,
    metadata: Annotated[Metadata | None, Field(description="The new metadata (replaces the old)")] = None,
    if_version: IfVersion = None,
) -> MemoryView:
    """Correct or relabel a memory: give at least one of content, tags, importance, pinned,
    metadata, and the reason. The memory gets a new version; the old one stays in its
    history and can be rolled back to."""
    changes = {"content": content, "tags": tags, "importance": importance, "pinned": pinned,
               "metadata": metadata}
    async with _engram(ctx) as engram:
        memory = await engram.modify(id, reason=reason, if_version=if_version,
                                     **{k: v for k, v in changes.items() if v is not None})
    return MemoryView.of(memory)


async def memory_forget(
    reason: ReasonParam, ctx: Context,
    id: Annotated[UUID | None, Field(description="One memory to forget now (soft delete)")] = None,
    scope: Annotated[Scope | None, Field(description=(
        "For a bulk forget (with query and/or filters): whose memories"))] = None,
    query: Annotated[str | None, Field(min_length=1, max_length=MAX_QUERY_CHARS, description=(
        "For a bulk forget: the memories that best match this"))] = None,
    filters: FiltersParam = None,
    limit: Annotated[wire_int(1, MAX_FORGET_IDS), Field(description=(
        "For a bulk forget by query: at most this many"))] = 100,
    if_version: IfVersion = None,
) -> ForgetResult:
    """Forget memories. Forgetting is recoverable: it is a soft delete, and a forgotten
    memory can be recovered within the recovery window. With `id`: that one memory is
    soft-deleted now (a pinned one only by an operator). With `scope` and a `query` and/or
    `filters`: a bulk forget, which this tool only PREVIEWS: nothing is deleted, and the
    answer is the operation id, the memories it would take and what a person must do. A
    bulk forget needs a human: a person confirms it (with the confirm token of a preview of
    their own) and, above the approval threshold, an operator approves it. You cannot
    confirm it."""
    selection = query is not None or filters is not None
    if id is not None and (scope is not None or selection):
        raise ToolError("validation_error: give either id (one memory) or scope with query and/or filters "
                        "(a bulk forget's preview), not both")
    if id is None and (scope is None or not selection):
        raise ToolError("validation_error: give id (one memory), or scope with query and/or filters "
                        "(a bulk forget's preview)")
    if id is None and if_version is not None:
        raise ToolError("validation_error: if_version is for forgetting one memory by id")
    async with _engram(ctx) as engram:
        if id is not None:
            memory = await engram.forget(id, reason=reason, if_version=if_version)
            return ForgetResult(outcome="forgotten", memory=MemoryView.of(memory), preview=None, next_step=(
                f"Soft-deleted: it is out of recall, and a person with the writer or operator role can "
                f"recover it within the recovery window (`engram recover {id} --reason ...`)."))
        preview = await engram.forget_preview(scope=scope, reason=reason, query=query, limit=limit,
                                              filters=filters)
    return ForgetResult(outcome="previewed", memory=None, preview=PreviewView.of(preview),
                        next_step=_confirm_step(preview, scope, query, filters, limit, reason))


async def memory_history(id: MemoryId, ctx: Context) -> HistoryView:
    """A memory now and every change to it, oldest first: who (actor), why (reason), by which
    path (mcp, http, cli, ...), and the content before and after."""
    async with _engram(ctx) as engram:
        history = await engram.history(id)
    return HistoryView(memory=MemoryView.of(history.memory), events=[HistoryEventView.of(e) for e in history.events])


def _confirm_step(preview: ForgetPreview, scope: Scope, query: str | None, filters: Filters | None, limit: int,
                  reason: str) -> str:
    """What a person does to carry out a previewed bulk forget. The preview's confirm token is
    not shown to the model, so the model cannot confirm it by any other route either: the
    person previews the same selection under their own key, and confirms that."""
    given = filters.given() if filters else {}
    args = ["engram", "batch-forget"]
    for part, value in scope.model_dump(exclude_none=True).items():
        args += [f"--{part.replace('_', '-')}", value]
    if query is not None:
        args += ["--query", query]
    for tag in given.pop("tags", []):
        args += ["--tag", tag]
    for name in ("type", "time"):
        if name in given:
            args += [f"--{name}", given.pop(name)]
    args += ["--limit", str(limit), "--reason", reason]
    how = (f"runs `{shlex.join(args)}`, which previews the same selection under their own key, shows it and asks "
           f"them to type its size" if not given else
           f"sends POST /api/memory/forget with the same scope, query and filters ({', '.join(sorted(given))} are "
           f"not flags of `engram batch-forget`), then POST /api/memory/forget/<operation id>/execute with the "
           f"answer's confirm_token")
    approval = (" Then, as the set is over the approval threshold or holds pinned memories, an operator other "
                "than that person approves it (`engram approvals list`, `engram approvals approve <operation id>`)."
                if preview.needs_approval else "")
    count = len(preview.candidates)
    return (f"Nothing was deleted: a bulk forget needs a person, and you cannot confirm it. To forget the {count} "
            f"previewed memor{'y' if count == 1 else 'ies'}, a person {how}.{approval} This preview "
            f"({preview.operation_id}) lapses unconfirmed at {preview.expires_at.isoformat()}.")


def main(args: argparse.Namespace) -> None:
    """Serve MCP until stopped (`engram mcp`): `args.transport` stdio or http (`args.host`,
    `args.port`, at /mcp), calling the API at `args.url` (default ENGRAM_URL). Exits with a
    message when stdio has no key."""
    url = args.url or default_url()
    if args.transport == "stdio":
        key = args.api_key or default_api_key()
        if not key:
            sys.exit("engram mcp: no API key: give --api-key, set ENGRAM_API_KEY or run `engram up` first")
        build_server(url=url, api_key=key).run("stdio")
    else:
        # Only a key given for this server: never the data directory's admin key (module docstring).
        build_server(url=url, api_key=args.api_key or os.environ.get("ENGRAM_API_KEY") or None).run(
            "streamable-http", host=args.host, port=args.port, streamable_http_path="/mcp")
