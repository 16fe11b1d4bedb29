"""`engram`'s commands that speak to the HTTP API (ENGRAM_URL, default http://127.0.0.1:8080)
with the key from ENGRAM_API_KEY or `$ENGRAM_DATA_DIR/api-key`, and the parser of every
command. The process commands (up, worker, api) start servers: worker.cli runs those."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

from engram.domain.auth import ROLES


def _key() -> str:
    key = os.environ.get("ENGRAM_API_KEY")
    if key:
        return key
    path = Path(os.environ.get("ENGRAM_DATA_DIR", "./data")) / "api-key"
    if path.exists():
        return path.read_text().strip()
    sys.exit("engram: no API key: set ENGRAM_API_KEY or run `engram up` first")


def _client() -> httpx.Client:
    # X-Engram-Client: history records that a change came by the CLI.
    return httpx.Client(base_url=os.environ.get("ENGRAM_URL", "http://127.0.0.1:8080"),
                        headers={"Authorization": f"Bearer {_key()}", "X-Engram-Client": "cli"}, timeout=60)


def _call(method: str, path: str, **kwargs) -> dict:
    with _client() as client:
        return _request(client, method, path, **kwargs)


def _request(client: httpx.Client, method: str, path: str, *, lead: str = "", unreachable: str = "",
             **kwargs) -> dict:
    """The answer's body; exits with the error contract's type and detail on an error status,
    and with `unreachable` added when the API cannot be reached. `lead` starts either message
    (a newline ends a progress bar first)."""
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as err:
        sys.exit(f"{lead}engram: cannot reach the API{unreachable}: {err}")
    body = response.json()
    if response.status_code >= 400:
        error = body.get("error", {})
        sys.exit(f"{lead}engram: {response.status_code} {error.get('type')}: {error.get('detail')}")
    return body


def _scope_given(args) -> dict:
    return {k: getattr(args, k) for k in ("user_id", "agent_id", "run_id") if getattr(args, k)}


def _scope(args) -> dict:
    scope = _scope_given(args)
    if not scope:
        sys.exit("engram: give at least one of --user-id, --agent-id, --run-id")
    return scope


def _print(body) -> None:
    print(json.dumps(body, indent=2, default=str))


def cmd_remember(args) -> None:
    body = {"content": args.content, "scope": _scope(args), "mode": args.mode, "tags": args.tag or []}
    if args.type:
        body["type"] = args.type
    if args.idempotency_key:
        body["idempotency_key"] = args.idempotency_key
    _print(_call("POST", "/api/memory/remember", json=body))


def cmd_search(args) -> None:
    body = {"query": args.query, "scope": _scope(args), "limit": args.limit}
    if args.time:
        body["filters"] = {"time": args.time}
    result = _call("POST", "/api/memory/search", json=body)
    if args.json:
        _print(result)
        return
    for hit in result["results"]:
        print(f"{hit['score']:.3f}  {hit['memory']['id']}  {hit['memory']['content'][:100]}")


def cmd_get(args) -> None:
    _print(_call("GET", f"/api/memory/{args.memory_id}"))


def _ask(prompt: str) -> str:
    """A line from the user; the prompt goes to stderr, so stdout stays the answer's JSON."""
    print(prompt, end="", file=sys.stderr, flush=True)
    return input().strip()


def cmd_modify(args) -> None:
    body = {"reason": args.reason}
    for name in ("content", "type", "importance"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if args.tag is not None:
        body["tags"] = args.tag
    if args.pinned is not None:
        body["pinned"] = args.pinned
    if args.if_version is not None:
        body["if_version"] = args.if_version
    _print(_call("PATCH", f"/api/memory/{args.memory_id}", json=body))


def cmd_forget(args) -> None:
    """Soft-delete one memory, after the user types its id back: a yes/no is too easy to give
    by habit. `--confirm <id>` is the same answer for scripts."""
    with _client() as client:
        memory = _request(client, "GET", f"/api/memory/{args.memory_id}")
        answer = args.confirm
        if answer is None:
            pinned = " (PINNED: needs --force, operators only)" if memory.get("pinned") else ""
            print(f"about to forget {memory['id']}{pinned}:\n  {memory['content'][:200]}", file=sys.stderr)
            try:
                answer = _ask("type the memory's id to confirm: ")
            except EOFError:
                answer = ""
        if answer != memory["id"]:
            sys.exit("engram: not confirmed: nothing was deleted")
        params = {"reason": args.reason, "force": str(args.force).lower()}
        if args.if_version is not None:
            params["if_version"] = args.if_version
        _print(_request(client, "DELETE", f"/api/memory/{args.memory_id}", params=params))


def cmd_recover(args) -> None:
    _print(_call("POST", f"/api/memory/{args.memory_id}/recover", json={"reason": args.reason}))


def cmd_rollback(args) -> None:
    _print(_call("POST", f"/api/memory/{args.memory_id}/rollback", json={"version": args.version,
                                                                        "reason": args.reason}))


def cmd_confirm(args) -> None:
    _print(_call("POST", f"/api/memory/{args.memory_id}/confirm", json={"reason": args.reason}))


def cmd_history(args) -> None:
    body = _call("GET", f"/api/memory/{args.memory_id}/history")
    if args.json:
        _print(body)
        return
    for e in body["events"]:
        what = e["reason"] or e["decision_reason"] or ""
        print(f"v{e['version']:<4} {e['event']:<10} {e['created_at'][:19]}  {e['actor_id']} ({e['actor_type']}, "
              f"{e['path'] or '-'})  {what}")


def cmd_verify(args) -> None:
    report = _call("GET", "/api/admin/verify")
    _print(report)
    if not report["ok"]:
        sys.exit(1)


def cmd_batch_forget(args) -> None:
    """Preview a batch forget, show it, and confirm it only after the number of memories it
    holds is typed back (`--confirm N` for scripts)."""
    body = {"scope": _scope(args), "reason": args.reason, "limit": args.limit, "force": args.force}
    if args.query:
        body["query"] = args.query
    filters = {k: v for k, v in (("tags", args.tag), ("type", args.type), ("time", args.time)) if v}
    if filters:
        body["filters"] = filters
    with _client() as client:
        preview = _request(client, "POST", "/api/memory/forget", json=body)
        count = len(preview["candidates"])
        for c in preview["candidates"]:
            print(f"  {c['id']}  v{c['version']}{'  PINNED' if c['pinned'] else ''}  {c['snippet'][:80]}", file=sys.stderr)
        print(f"{count} memories (of {preview['total_matched']} matching) in operation {preview['operation_id']}"
              + (" (needs an operator's approval after you confirm)" if preview["needs_approval"] else ""),
              file=sys.stderr)
        answer = args.confirm
        if answer is None:
            try:
                answer = _ask(f"type {count} to forget them: ")
            except EOFError:
                answer = ""
        if answer != str(count):
            sys.exit(f"engram: not confirmed: nothing was deleted ({preview['operation_id']} expires unconfirmed)")
        _print(_request(client, "POST", f"/api/memory/forget/{preview['operation_id']}/execute",
                        json={"confirm_token": preview["confirm_token"]}))


def cmd_operation(args) -> None:
    _print(_call("GET", f"/api/memory/forget/{args.operation_id}"))


def cmd_undo(args) -> None:
    _print(_call("POST", f"/api/memory/forget/{args.operation_id}/undo", json={"reason": args.reason}))


def cmd_approvals(args) -> None:
    if args.approvals_command == "list":
        for op in _call("GET", "/api/approvals")["items"]:
            print(f"{op['operation_id']}  {op['total']:>5} memories  by {op['requester']}  {op['reason']}")
        return
    _print(_call("POST", f"/api/approvals/{args.operation_id}/{args.approvals_command}", json={"reason": args.reason}))


def cmd_review(args) -> None:
    if args.review_command == "list":
        params = {"status": args.status} if args.status else {}
        for r in _call("GET", "/api/reviews", params=params)["items"]:
            print(f"{r['id']}  {r['status']:<9}  new: {r['new']['content']!r}"
                  f"  vs existing: {r['existing']['content']!r}  ({r['reason'] or 'no reason given'})")
        return
    body = {"resolution": args.resolution, "reason": args.reason}
    if args.content:
        body["content"] = args.content
    _print(_call("POST", f"/api/reviews/{args.review_id}/resolve", json=body))


def cmd_pending(args) -> None:
    if args.pending_command == "list":
        for a in _call("GET", "/api/memory/approvals", params={"status": args.status})["items"]:
            m = a["memory"]
            print(f"{a['id']}  {a['status']:<11}  {m['memory_type']:<10} {m['trust']:<12} by {a['requested_by']}"
                  f"  {m['content']!r}")
        return
    _print(_call("POST", f"/api/memory/approvals/{args.approval_id}/decide",
                 json={"decision": args.pending_command, "reason": args.reason}))


def cmd_verify_receipt(args) -> None:
    receipt = json.loads(Path(args.file).read_text())
    result = _call("POST", "/api/receipts/verify", json=receipt)
    _print(result)
    if not result["ok"]:
        sys.exit(1)


def cmd_control(args) -> None:
    if args.control_command == "status":
        _print(_call("GET", "/api/control"))
        return
    switch, on = {"freeze": ("freeze", True), "unfreeze": ("freeze", False),
                  "kill-switch": ("kill_switch", args.state == "on")}[args.control_command]
    body = {"switch": switch, "on": on, "reason": args.reason}
    scope = _scope_given(args) if switch == "freeze" else {}
    if scope:
        body["scope"] = scope
    _print(_call("POST", "/api/control", json=body))


def progress_bar(progress: dict, width: int = 30) -> str:
    """`[#######.......]  700/1500  47%` for a job's {"done", "total"}."""
    done, total = progress["done"], max(progress["total"], 1)
    filled = width * min(done, total) // total
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>7}/{progress['total']} {100 * done // total:>3}%"


def cmd_jobs(args) -> None:
    job = _call("GET", f"/api/memory/jobs/{args.job_id}")
    while args.watch and job["status"] not in ("done", "dead"):
        if job.get("progress"):
            print("\r" + progress_bar(job["progress"]), end="", file=sys.stderr, flush=True)
        time.sleep(1)
        job = _call("GET", f"/api/memory/jobs/{args.job_id}")
    if job.get("progress"):
        print("\r" + progress_bar(job["progress"]), file=sys.stderr)
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
    with _client() as client:
        for start in range(0, len(items), args.batch_size):
            chunk = items[start:start + args.batch_size]
            body = _request(client, "POST", "/api/memory/remember/batch", json={"items": [item for _, item in chunk]},
                            lead="\n", unreachable=f" after {stored} stored")
            job_ids.append(body["job_id"])
            stored += body["stored"]
            failed += body["failed"]
            for result in body["results"]:
                if result.get("error"):
                    line = chunk[result["index"]][0]
                    print(f"\rline {line}: {result['error']['type']}: {result['error']['detail']}", file=sys.stderr)
            print("\r" + progress_bar({"done": start + len(chunk), "total": len(items)}) + " sent",
                  end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        while args.wait and job_ids:
            jobs = [client.get(f"/api/memory/jobs/{job_id}").json() for job_id in job_ids]
            done = sum(j["progress"]["done"] for j in jobs)
            parked = sum(j["progress"].get("parked", 0) for j in jobs)
            total = sum(j["progress"]["total"] for j in jobs)
            print("\r" + progress_bar({"done": done, "total": total}) + f" processed, {parked} parked",
                  end="", file=sys.stderr, flush=True)
            if done + parked >= total:
                print(file=sys.stderr)
                break
            time.sleep(1)
    _print({"stored": stored, "failed": failed, "jobs": job_ids})
    if failed:
        sys.exit(1)


def cmd_status(args) -> None:
    try:
        with _client() as client:
            response = client.get("/readyz")
    except httpx.HTTPError as err:
        sys.exit(f"engram: cannot reach the API: {err}")
    _print(response.json())
    if response.status_code != 200:
        sys.exit(1)


def cmd_keys_create(args) -> None:
    _print(_call("POST", "/api/keys", json={"name": args.name, "role": args.role, "scopes": args.scope}))


def cmd_keys_list(args) -> None:
    items = _call("GET", "/api/keys")["items"]
    if args.json:
        _print(items)
        return
    print(f"{'id':36}  {'name':20}  {'role':6}  {'state':7}  scopes")
    for key in items:
        state = "revoked" if key["revoked_at"] else "active"
        print(f"{key['id']:36}  {key['name'][:20]:20}  {key['role']:6}  {state:7}  {' '.join(key['scopes'])}")


def cmd_keys_revoke(args) -> None:
    key = _call("DELETE", f"/api/keys/{args.key_id}")
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


PROCESS_COMMANDS = ("up", "worker", "api")  # started by worker.cli, the `engram` entry point


def run(args: argparse.Namespace) -> None:
    """Run one of the API client commands (every command but PROCESS_COMMANDS)."""
    args.func(args)
