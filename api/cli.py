"""`engram`'s commands that speak to the HTTP API, through the SDK (engram.client: ENGRAM_URL,
default http://127.0.0.1:8080, with the key from ENGRAM_API_KEY or `$ENGRAM_DATA_DIR/api-key`),
and the parser of every command. The process commands (up, worker, api, mcp) start servers:
worker.cli runs those."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from engram.client import IMPORT_SETTLED, JOB_FINISHED, ApiError, ConnectionFailed, Engram
from engram.client.wire import default_api_key
from engram.domain.auth import ROLES


class _Unreachable(Exception):
    """The API could not be reached, with what the command had done by then."""


def _engram() -> Engram:
    """The SDK's client, as the CLI: history records `path` cli for its changes."""
    key = default_api_key()
    if key is None:
        sys.exit("engram: no API key: set ENGRAM_API_KEY or run `engram up` first")
    return Engram(api_key=key, client="cli")


def _failed(err: ApiError | ConnectionFailed, *, lead: str = "", unreachable: str = "") -> str:
    """The message an error exits with: the error contract's status, type and detail, or that
    the API cannot be reached (`unreachable` says what was done by then). `lead` starts it (a
    newline ends a progress bar first)."""
    if isinstance(err, ApiError):
        return f"{lead}engram: {err.status} {err.type}: {err.detail}"
    return f"{lead}engram: cannot reach the API{unreachable}: {err}"


def _scope_given(args) -> dict:
    return {k: getattr(args, k) for k in ("user_id", "agent_id", "run_id") if getattr(args, k)}


def _scope(args) -> dict:
    scope = _scope_given(args)
    if not scope:
        sys.exit("engram: give at least one of --user-id, --agent-id, --run-id")
    return scope


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def _print(value) -> None:
    print(json.dumps(_json(value), indent=2, default=str))


def _present(**values) -> dict:
    """The flags that were given (None: not given, so the server's default applies)."""
    return {name: value for name, value in values.items() if value is not None}


def cmd_remember(args) -> None:
    with _engram() as engram:
        _print(engram.remember(args.content, scope=_scope(args), mode=args.mode, tags=args.tag or [],
                               idempotency_key=args.idempotency_key, **_present(type=args.type)))


def cmd_search(args) -> None:
    with _engram() as engram:
        result = engram.search(args.query, scope=_scope(args), limit=args.limit,
                               filters={"time": args.time} if args.time else None,
                               **_present(rerank=args.rerank, explain=args.explain or None))
    if args.json:
        _print(result)
        return
    for hit in result.results:
        print(f"{hit.score:.3f}  {hit.memory.id}  {hit.memory.content[:100]}")
    for warning in result.warnings:
        print(f"warning: {warning}")
    for name, stage in (result.explain or {}).items():
        facts = "  ".join(f"{key}={value}" for key, value in stage.items() if key != "ms")
        print(f"{name:<12} {stage['ms']:8.1f} ms  {facts}".rstrip())


def cmd_get(args) -> None:
    with _engram() as engram:
        _print(engram.get(args.memory_id))


def _ask(prompt: str) -> str:
    """A line from the user; the prompt goes to stderr, so stdout stays the answer's JSON."""
    print(prompt, end="", file=sys.stderr, flush=True)
    return input().strip()


def cmd_modify(args) -> None:
    with _engram() as engram:
        _print(engram.modify(args.memory_id, reason=args.reason, if_version=args.if_version,
                             **_present(content=args.content, type=args.type, importance=args.importance,
                                        tags=args.tag, pinned=args.pinned)))


def cmd_forget(args) -> None:
    """Soft-delete one memory, after the user types its id back: a yes/no is too easy to give
    by habit. `--confirm <id>` is the same answer for scripts."""
    with _engram() as engram:
        memory = engram.get(args.memory_id)
        answer = args.confirm
        if answer is None:
            pinned = " (PINNED: needs --force, operators only)" if memory.pinned else ""
            print(f"about to forget {memory.id}{pinned}:\n  {memory.content[:200]}", file=sys.stderr)
            try:
                answer = _ask("type the memory's id to confirm: ")
            except EOFError:
                answer = ""
        if answer != str(memory.id):
            sys.exit("engram: not confirmed: nothing was deleted")
        _print(engram.forget(args.memory_id, reason=args.reason, force=args.force, if_version=args.if_version))


def cmd_recover(args) -> None:
    with _engram() as engram:
        _print(engram.recover(args.memory_id, reason=args.reason))


def cmd_rollback(args) -> None:
    with _engram() as engram:
        _print(engram.rollback(args.memory_id, version=args.version, reason=args.reason))


def cmd_confirm(args) -> None:
    with _engram() as engram:
        _print(engram.confirm(args.memory_id, reason=args.reason))


def cmd_history(args) -> None:
    with _engram() as engram:
        history = engram.history(args.memory_id)
    if args.json:
        _print(history)
        return
    for e in history.events:
        what = e.reason or e.decision_reason or ""
        print(f"v{e.version:<4} {e.event:<10} {e.created_at.isoformat()[:19]}  {e.actor_id} ({e.actor_type}, "
              f"{e.path or '-'})  {what}")


def cmd_verify(args) -> None:
    with _engram() as engram:
        report = engram.verify()
    _print(report)
    if not report.ok:
        sys.exit(1)


def cmd_batch_forget(args) -> None:
    """Preview a batch forget, show it, and confirm it only after the number of memories it
    holds is typed back (`--confirm N` for scripts)."""
    filters = {k: v for k, v in (("tags", args.tag), ("type", args.type), ("time", args.time)) if v}
    with _engram() as engram:
        preview = engram.forget_preview(scope=_scope(args), reason=args.reason, query=args.query,
                                        filters=filters or None, limit=args.limit, force=args.force)
        count = len(preview.candidates)
        for c in preview.candidates:
            print(f"  {c.id}  v{c.version}{'  PINNED' if c.pinned else ''}  {c.snippet[:80]}", file=sys.stderr)
        print(f"{count} memories (of {preview.total_matched} matching) in operation {preview.operation_id}"
              + (" (needs an operator's approval after you confirm)" if preview.needs_approval else ""),
              file=sys.stderr)
        answer = args.confirm
        if answer is None:
            try:
                answer = _ask(f"type {count} to forget them: ")
            except EOFError:
                answer = ""
        if answer != str(count):
            sys.exit(f"engram: not confirmed: nothing was deleted ({preview.operation_id} expires unconfirmed)")
        _print(engram.forget_execute(preview.operation_id, confirm_token=preview.confirm_token))


def cmd_operation(args) -> None:
    with _engram() as engram:
        _print(engram.forget_status(args.operation_id))


def cmd_undo(args) -> None:
    with _engram() as engram:
        _print(engram.forget_undo(args.operation_id, reason=args.reason))


def cmd_approvals(args) -> None:
    with _engram() as engram:
        if args.approvals_command == "list":
            for op in engram.approvals().items:
                print(f"{op.operation_id}  {op.total:>5} memories  by {op.requester}  {op.reason}")
            return
        decide = engram.approve if args.approvals_command == "approve" else engram.reject
        _print(decide(args.operation_id, reason=args.reason))


def cmd_review(args) -> None:
    with _engram() as engram:
        if args.review_command == "list":
            for r in engram.reviews(status=args.status).items:
                print(f"{r.id}  {r.status:<9}  new: {r.new.content!r}"
                      f"  vs existing: {r.existing.content!r}  ({r.reason or 'no reason given'})")
            return
        _print(engram.resolve_review(args.review_id, resolution=args.resolution, reason=args.reason,
                                     content=args.content or None))


def cmd_pending(args) -> None:
    with _engram() as engram:
        if args.pending_command == "list":
            for a in engram.write_approvals(status=args.status).items:
                m = a.memory
                print(f"{a.id}  {a.status:<11}  {m.memory_type:<10} {m.trust:<12} by {a.requested_by}"
                      f"  {m.content!r}")
            return
        _print(engram.decide_write(args.approval_id, decision=args.pending_command, reason=args.reason))


def cmd_verify_receipt(args) -> None:
    receipt = json.loads(Path(args.file).read_text())
    with _engram() as engram:
        result = engram.verify_receipt(receipt)
    _print(result)
    if not result.ok:
        sys.exit(1)


def cmd_control(args) -> None:
    with _engram() as engram:
        if args.control_command == "status":
            _print(engram.control())
            return
        switch, on = {"freeze": ("freeze", True), "unfreeze": ("freeze", False),
                      "kill-switch": ("kill_switch", args.state == "on")}[args.control_command]
        scope = _scope_given(args) if switch == "freeze" else {}
        _print(engram.set_control(switch, on, reason=args.reason, scope=scope or None))


def progress_bar(progress: dict, width: int = 30) -> str:
    """`[#######.......]  700/1500  47%` for a job's {"done", "total"}."""
    done, total = progress["done"], max(progress["total"], 1)
    filled = width * min(done, total) // total
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>7}/{progress['total']} {100 * done // total:>3}%"


def cmd_jobs(args) -> None:
    with _engram() as engram:
        snapshots = engram.watch_job(args.job_id) if args.watch else [engram.job(args.job_id)]
        for job in snapshots:
            if job.progress and job.status not in JOB_FINISHED:
                print("\r" + progress_bar(job.progress), end="", file=sys.stderr, flush=True)
    if job.progress:
        print("\r" + progress_bar(job.progress), file=sys.stderr)
    _print(job)


def _import_items(path: Path, scope: dict | None):
    """(line number, item) for each non-blank line of a JSON Lines file: an object is a
    remember item (the flags' scope fills in a missing scope); any other line is its content."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                item = line.rstrip("\n")
            if not isinstance(item, dict):
                item = {"content": item if isinstance(item, str) else line.rstrip("\n")}
            if scope and "scope" not in item:
                item["scope"] = scope
            yield number, item


def cmd_import(args) -> None:
    path = Path(args.file)
    if not path.exists():
        sys.exit(f"engram: no file {path}")
    items = list(_import_items(path, _scope_given(args) or None))
    stored = failed = 0
    job_ids = []
    with _engram() as engram:
        for start in range(0, len(items), args.batch_size):
            chunk = items[start:start + args.batch_size]
            try:  # each batch has its own Idempotency-Key, so the SDK's retries store nothing twice
                body = engram.remember_batch([item for _, item in chunk])
            except (ApiError, ConnectionFailed) as err:
                sys.exit(_failed(err, lead="\n", unreachable=f" after {stored} stored"))
            job_ids.append(body.job_id)
            stored += body.stored
            failed += body.failed
            for result in body.results:
                if result.error:
                    line = chunk[result.index][0]
                    print(f"\rline {line}: {result.error.type}: {result.error.detail}", file=sys.stderr)
            print("\r" + progress_bar({"done": start + len(chunk), "total": len(items)}) + " sent",
                  end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        if args.wait:
            _watch_imports(engram, [job_id for job_id in job_ids if job_id is not None])
    _print({"stored": stored, "failed": failed, "jobs": [str(j) if j else None for j in job_ids]})
    if failed:
        sys.exit(1)


def _watch_imports(engram: Engram, job_ids: list) -> None:
    """One progress bar over every import job, until each has every item through or parked."""
    latest = {job_id: engram.job(job_id) for job_id in job_ids}
    for job_id in job_ids:
        for job in engram.watch_job(job_id, until=IMPORT_SETTLED):
            latest[job_id] = job
            counts = [j.progress or {} for j in latest.values()]
            done, parked = sum(c.get("done", 0) for c in counts), sum(c.get("parked", 0) for c in counts)
            print("\r" + progress_bar({"done": done, "total": sum(c.get("total", 0) for c in counts)})
                  + f" processed, {parked} parked", end="", file=sys.stderr, flush=True)
    if job_ids:
        print(file=sys.stderr)


def cmd_status(args) -> None:
    with _engram() as engram:
        readiness = engram.readiness()
    _print(readiness)
    if not readiness.ready:
        sys.exit(1)


def cmd_keys_create(args) -> None:
    with _engram() as engram:
        _print(engram.create_key(args.name, role=args.role, scopes=args.scope))


def cmd_keys_list(args) -> None:
    with _engram() as engram:
        items = engram.keys().items
    if args.json:
        _print(items)
        return
    print(f"{'id':36}  {'name':20}  {'role':6}  {'state':7}  scopes")
    for key in items:
        state = "revoked" if key.revoked_at else "active"
        print(f"{str(key.id):36}  {key.name[:20]:20}  {key.role:6}  {state:7}  {' '.join(key.scopes)}")


def cmd_keys_revoke(args) -> None:
    with _engram() as engram:
        key = _json(engram.revoke_key(args.key_id))
    print(f"revoked {key['id']} ({key['name']}) at {key['revoked_at']}")


def _add_scope(parser) -> None:
    parser.add_argument("--user-id")
    parser.add_argument("--agent-id")
    parser.add_argument("--run-id")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engram", description="Long-term memory for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="run the whole service on the embedded stack")
    sub.add_parser("worker", help="run the Temporal worker and outbox dispatcher (scaled deployment)")
    sub.add_parser("api", help="run the HTTP API (scaled deployment)")
    p = sub.add_parser("mcp", help="serve the Model Context Protocol to agents (stdio or streamable HTTP)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="the streamable HTTP transport's address")
    p.add_argument("--port", type=int, default=8090, help="the streamable HTTP transport's port")
    p.add_argument("--url", help="the Engram API (default ENGRAM_URL, else http://127.0.0.1:8080)")
    p.add_argument("--api-key", help="the Engram key the tools act with (default ENGRAM_API_KEY; over stdio "
                                     "also $ENGRAM_DATA_DIR/api-key; over http a request's own Bearer "
                                     "key comes first)")

    p = sub.add_parser("remember", help="remember a text")
    p.add_argument("content")
    _add_scope(p)
    p.add_argument("--type")
    p.add_argument("--tag", action="append")
    p.add_argument("--mode", choices=["auto", "sync", "async"], default="auto")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_remember)

    p = sub.add_parser("search", help="recall memories")
    p.add_argument("query")
    _add_scope(p)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--time", help='e.g. "last 3 months", "yesterday"')
    p.add_argument("--rerank", action=argparse.BooleanOptionalAction,
                   help="reorder the top with the cross-encoder, or not (default: ENGRAM_RERANK_DEFAULT)")
    p.add_argument("--explain", action="store_true", help="also print each stage's time in ms and what it did")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("get", help="show one memory")
    p.add_argument("memory_id")
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("modify", help="change a memory's content or labels, with a reason")
    p.add_argument("memory_id")
    p.add_argument("--reason", required=True)
    p.add_argument("--content")
    p.add_argument("--type")
    p.add_argument("--tag", action="append", help="the new tags (repeat); replaces the old ones")
    p.add_argument("--importance", type=float)
    p.add_argument("--pin", dest="pinned", action="store_const", const=True)
    p.add_argument("--unpin", dest="pinned", action="store_const", const=False)
    p.add_argument("--if-version", type=int, help="change only if the memory is at this version")
    p.set_defaults(func=cmd_modify)

    p = sub.add_parser("forget", help="soft-delete a memory (recoverable); asks you to type its id back")
    p.add_argument("memory_id")
    p.add_argument("--reason", required=True)
    p.add_argument("--force", action="store_true", help="a pinned memory (operators only)")
    p.add_argument("--if-version", type=int)
    p.add_argument("--confirm", metavar="MEMORY_ID", help="the memory's id again, instead of typing it")
    p.set_defaults(func=cmd_forget)

    p = sub.add_parser("batch-forget", help="forget what a query or filters select in a scope: preview, then "
                                            "confirm by typing the count (an operator approves large sets)")
    _add_scope(p)
    p.add_argument("--query")
    p.add_argument("--tag", action="append")
    p.add_argument("--type")
    p.add_argument("--time", help='a time phrase: "last 3 months", "yesterday"')
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--reason", required=True)
    p.add_argument("--force", action="store_true", help="include pinned memories (operators only)")
    p.add_argument("--confirm", metavar="COUNT", help="the number of memories previewed, instead of typing it")
    p.set_defaults(func=cmd_batch_forget)

    p = sub.add_parser("operation", help="a batch forget's status, progress and receipt")
    p.add_argument("operation_id")
    p.set_defaults(func=cmd_operation)

    p = sub.add_parser("undo", help="recover exactly what a batch forget deleted")
    p.add_argument("operation_id")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=cmd_undo)

    approvals = sub.add_parser("approvals", help="batch forgets waiting for an operator (operators)")
    approval_commands = approvals.add_subparsers(dest="approvals_command", required=True)
    approval_commands.add_parser("list").set_defaults(func=cmd_approvals)
    for verb in ("approve", "reject"):
        p = approval_commands.add_parser(verb)
        p.add_argument("operation_id")
        p.add_argument("--reason", required=True)
        p.set_defaults(func=cmd_approvals)

    review = sub.add_parser("review", help="contradictions the write pipeline kept for a person")
    review_commands = review.add_subparsers(dest="review_command", required=True)
    p = review_commands.add_parser("list", help="waiting reviews (open, escalated), oldest first")
    p.add_argument("--status", choices=["open", "escalated", "resolved", "expired"])
    p.set_defaults(func=cmd_review)
    p = review_commands.add_parser("resolve", help="end a review: keep_existing, replace, keep_both, merge, escalate")
    p.add_argument("review_id")
    p.add_argument("resolution", choices=["keep_existing", "replace", "keep_both", "merge", "escalate"])
    p.add_argument("--reason", required=True)
    p.add_argument("--content", help="the merged text (merge only)")
    p.set_defaults(func=cmd_review)

    pending = sub.add_parser("pending", help="writes waiting for an operator's approval (an UNTRUSTED source's FACT, "
                                             "any LEARNED)")
    pending_commands = pending.add_subparsers(dest="pending_command", required=True)
    p = pending_commands.add_parser("list", help="the approval queue, oldest first")
    p.add_argument("--status", default="pending",
                   choices=["pending", "approved", "rejected", "quarantined", "withdrawn"])
    p.set_defaults(func=cmd_pending)
    for decision, text in (("approve", "into recall (its facts are then extracted)"),
                           ("reject", "forget it (soft; an operator may recover it)"),
                           ("quarantine", "hold it aside, out of recall")):
        p = pending_commands.add_parser(decision, help=text)
        p.add_argument("approval_id")
        p.add_argument("--reason", required=True)
        p.set_defaults(func=cmd_pending)

    control = sub.add_parser("control", help="the operational switches: freeze mutations, the kill switch (operators)")
    control_commands = control.add_subparsers(dest="control_command", required=True)
    control_commands.add_parser("status").set_defaults(func=cmd_control)
    for verb, what in (("freeze", "refuse every change (in one scope, with --user-id/--agent-id/--run-id)"),
                       ("unfreeze", "lift a freeze (the same scope it was set on)")):
        p = control_commands.add_parser(verb, help=what)
        _add_scope(p)
        p.add_argument("--reason", required=True)
        p.set_defaults(func=cmd_control)
    p = control_commands.add_parser("kill-switch", help="stop (on) or allow (off) autonomous mutations")
    p.add_argument("state", choices=["on", "off"])
    p.add_argument("--reason", required=True)
    p.set_defaults(func=cmd_control)

    p = sub.add_parser("verify-receipt", help="check an erasure receipt (a JSON file) against the database")
    p.add_argument("file")
    p.set_defaults(func=cmd_verify_receipt)

    p = sub.add_parser("recover", help="bring back a deleted memory within its recovery window")
    p.add_argument("memory_id")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=cmd_recover)

    p = sub.add_parser("rollback", help="write a new version equal to an earlier one")
    p.add_argument("memory_id")
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--reason", required=True)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("confirm", help="accept a quarantined memory's row as it is (operators)")
    p.add_argument("memory_id")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=cmd_confirm)

    p = sub.add_parser("history", help="a memory's history: every version, who, why, by which way")
    p.add_argument("memory_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("verify", help="check every hash chain; exits 1 if one is broken (operators)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("jobs", help="show a job: state, attempts, next retry, last error")
    p.add_argument("job_id")
    p.add_argument("--watch", action="store_true", help="poll until the job is done or dead")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("import", help="remember every line of a JSON Lines file, in bulk, with a progress bar")
    p.add_argument("file", help="one remember item (a JSON object) or one text per line")
    _add_scope(p)
    p.add_argument("--batch-size", type=int, default=500, help="items per request (at most the server's limit)")
    p.add_argument("--wait", action="store_true", help="then show processing progress until every item is through")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("status", help="each component's state, the write queue and parked extractions")
    p.set_defaults(func=cmd_status)

    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    p = keys.add_parser("create", help="create an API key (admin)")
    p.add_argument("name")
    p.add_argument("--role", choices=list(ROLES), required=True)
    p.add_argument("--scope", action="append", required=True, help="'*', 'user:<id>', 'agent:<id>', 'run:<id>'")
    p.set_defaults(func=cmd_keys_create)
    p = keys.add_parser("list", help="every key, revoked ones too, never a secret (admin)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_keys_list)
    p = keys.add_parser("revoke", help="revoke a key by id; it stops working at once (admin)")
    p.add_argument("key_id")
    p.set_defaults(func=cmd_keys_revoke)
    return parser


PROCESS_COMMANDS = ("up", "worker", "api", "mcp")  # started by worker.cli, the `engram` entry point


def run(args: argparse.Namespace) -> None:
    """Run one of the API client commands (every command but PROCESS_COMMANDS). An error answer
    exits with `engram: <status> <type>: <detail>`; an API out of reach with `engram: cannot
    reach the API: ...` (after the SDK's retries)."""
    try:
        args.func(args)
    except (ApiError, ConnectionFailed) as err:
        sys.exit(_failed(err))
