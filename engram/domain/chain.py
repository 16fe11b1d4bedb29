"""The hash chains that make history tamper-evident.

Per memory: every history event carries SHA-256 over a canonical encoding of what it did (the
event, the version, the state it left, who, why, by which way, when) and the previous event's
hash; the memory's row keeps the newest (`chain_hash`). A row edited behind the service's back
no longer matches its newest event's state; an edited event no longer matches its hash; a
deleted one breaks the links.

Per scope: events are also chained in the order they were sealed,
scope_hash = sha256(previous scope_hash + hash), so a deleted or edited audit row of any
memory shows in its scope's chain.

The encoding is what Postgres gives back, not what was sent: importance is a float32 there,
and jsonb reads an integral float back as an integer, so both are normalised before hashing.
The hash keeps importance to 6 significant digits (the encoding chains were first sealed with);
a row is compared with its newest event's state exactly, as the `real` it is stored as.
"""

from __future__ import annotations

import hashlib
import json
import struct
from decimal import Decimal
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

STATE_FIELDS = ("content", "type", "tags", "importance", "pinned", "metadata", "is_deleted")


def real(value: float) -> float:
    """`value` as a Postgres `real` (float32) column gives it back: what the row holds."""
    return struct.unpack("f", struct.pack("f", value))[0]


def state_of(memory: Any) -> dict[str, Any]:
    """The state a history event records: a memory's (a model's, a row's or a dict's) fields
    that a change can set."""
    if hasattr(memory, "keys"):
        return {name: _plain(memory[name]) for name in STATE_FIELDS}
    return {name: _plain(getattr(memory, name)) for name in STATE_FIELDS}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def _canonical(value: Any) -> Any:
    """JSON-ready and as Postgres returns it: integral floats as integers, others to float32's
    precision where they came from a `real` column (importance: see `encode`)."""
    if isinstance(value, float) and value.is_integer():
        return int(Decimal(repr(value)))  # as jsonb keeps it: the decimal JSON wrote, 1e+300 as 10**300
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def encode(fields: dict[str, Any]) -> bytes:
    """The canonical bytes of `fields`: sorted keys, no spaces, UTF-8."""
    state = fields.get("state")
    if isinstance(state, dict) and isinstance(state.get("importance"), float):
        state = {**state, "importance": format(state["importance"], ".6g")}  # a real holds ~7 digits
        fields = {**fields, "state": state}
    return json.dumps(_canonical(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def instant(when: datetime) -> str:
    """A timestamp as history hashes it: UTC, microseconds (what timestamptz keeps)."""
    return when.astimezone(timezone.utc).isoformat(timespec="microseconds")


def event_hash(*, memory_id: UUID, scope: tuple[str | None, str | None, str | None], event: str, version: int,
               state: dict[str, Any] | None, actor_id: str, path: str | None, reason: str | None,
               created_at: datetime, prev_hash: str | None) -> str:
    """SHA-256 (hex) of one history event, linked to the memory's previous event."""
    return hashlib.sha256(encode({
        "memory_id": str(memory_id), "scope": list(scope), "event": event, "version": version, "state": state,
        "actor": actor_id, "path": path, "reason": reason, "at": instant(created_at), "prev": prev_hash or "",
    })).hexdigest()


def scope_link(prev_scope_hash: str | None, hash_: str) -> str:
    """The next scope_hash: sha256 of the previous one (empty at the start) followed by the event's hash."""
    return hashlib.sha256(((prev_scope_hash or "") + hash_).encode()).hexdigest()


def same_state(row_state: dict[str, Any], recorded: dict[str, Any] | None) -> bool:
    """Whether a row's state is the one its newest event recorded."""
    return recorded is not None and all(_same_field(name, row_state.get(name), recorded.get(name))
                                        for name in STATE_FIELDS)


def _same_field(name: str, row_value: Any, recorded: Any) -> bool:
    if name == "importance" and isinstance(row_value, (int, float)) and isinstance(recorded, (int, float)):
        # An event may record the importance as sent (0.1234565): the row holds its float32.
        return real(row_value) == real(recorded)
    # Every verified read judges seven fields of each row: most are identical, and only the
    # rest are worth encoding (an integral float in one and an int in the other still match).
    if _identical(row_value, recorded):
        return True
    return encode({"state": {name: row_value}}) == encode({"state": {name: recorded}})


_SCALARS = (str, int, float, bool, type(None))


def _identical(a: Any, b: Any) -> bool:
    """Equal and of one type all the way down, with string keys only (what jsonb gives back),
    so their canonical encodings are equal too; False says nothing either way."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return (a.keys() == b.keys() and all(type(key) is str for key in a)
                and all(_identical(value, b[key]) for key, value in a.items()))
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(map(_identical, a, b))
    return type(a) in _SCALARS and a == b


def newest_mismatch(row: Any, newest: Any) -> str | None:
    """Why a memory's row does not match its chain's newest event (both read in one snapshot),
    or None. `row` holds the state fields, id, scope parts, version and chain_hash; `newest` the
    event row (None: no event). A memory not sealed yet (chain_hash null) is not judged."""
    if row["chain_hash"] is None:
        return None
    if newest is None:
        return "it has no history"
    recomputed = event_hash(memory_id=newest["memory_id"], scope=(row["user_id"], row["agent_id"], row["run_id"]),
                            event=newest["event"], version=newest["version"], state=newest["state"],
                            actor_id=newest["actor_id"], path=newest["path"], reason=newest["reason"],
                            created_at=newest["created_at"], prev_hash=newest["prev_hash"])
    if recomputed != newest["hash"]:
        return f"its newest history event ({newest['event']}, version {newest['version']}) does not match its hash"
    if newest["hash"] != row["chain_hash"]:
        return "its newest history event is not its chain's head (an event was removed)"
    if newest["version"] != row["version"]:
        return f"its version {row['version']} is not its newest event's {newest['version']}"
    if not same_state(state_of(row), newest["state"]):
        changed = [f for f in STATE_FIELDS if not _same_field(f, state_of(row)[f], (newest["state"] or {}).get(f))]
        return f"its {', '.join(changed)} differ from what its newest history event recorded"
    return None
