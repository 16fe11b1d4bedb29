"""Principals, roles, scope grants, and the one rule for what a caller may see.

A key's grants are strings: `*` (every scope), `user:<id>`, `agent:<id>`, `run:<id>`, where
`<id>` may be `*`. A caller may touch a scope when each of its set parts is granted; it sees a
memory only if it may touch the memory's whole scope. Every read path applies that rule:
`Visibility` carries it into SQL and the vector filter, `may_touch` into a check of one row.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from engram.domain.errors import Forbidden, ValidationFailed
from engram.domain.models import Scope

ROLES = ("reader", "agent", "writer", "operator", "admin")
# The permission matrix: what each role may do (README "Roles" shows the same table; a test
# checks that the two agree). An `agent` is a model acting for a user: it may change memories
# but never recover, roll back or force, and its edits count as automatic (engram.changes:
# a human's edit locks a memory against them for a while). `force_delete` removes a pinned
# memory; `maintenance` runs the repair loops and `engram verify`; `admin` manages keys.
PERMISSIONS: dict[str, frozenset[str]] = {
    "reader": frozenset({"search", "read"}),
    "agent": frozenset({"search", "read", "remember", "modify", "forget"}),
    "writer": frozenset({"search", "read", "remember", "modify", "forget", "recover", "rollback"}),
    "operator": frozenset({"search", "read", "remember", "modify", "forget", "recover", "rollback",
                           "force_delete", "approve", "maintenance"}),
}
PERMISSIONS["admin"] = PERMISSIONS["operator"] | {"admin"}
ACTIONS = ("search", "read", "remember", "modify", "forget", "recover", "rollback", "force_delete", "approve",
           "maintenance", "admin")
AUTOMATIC_ROLES = frozenset({"agent"})  # whose edits are automatic, like the pipeline's
_PREFIX = {"user_id": "user", "agent_id": "agent", "run_id": "run"}


@dataclass(frozen=True)
class Visibility:
    """Which memories a caller sees, as a restriction per scope part.

    `allowed[part]` is the set of values that part may hold; a part absent from `allowed` may
    hold any value. A memory whose part is null always passes that part. No entries: every
    memory is visible.
    """

    allowed: tuple[tuple[str, frozenset[str]], ...] = ()

    def admits(self, user_id: str | None, agent_id: str | None, run_id: str | None) -> bool:
        values = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
        return all(values[part] is None or values[part] in granted for part, granted in self.allowed)


EVERYTHING = Visibility()


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `id` is `key:<the key's uuid>`: immutable, so it names the actor
    in history and the namespace of idempotency keys; `name` is for people."""

    id: str
    name: str
    role: str
    grants: tuple[str, ...]

    def may(self, action: str) -> bool:
        return action in PERMISSIONS[self.role]

    @property
    def visibility(self) -> Visibility:
        if "*" in self.grants:
            return EVERYTHING
        allowed = []
        for part, prefix in _PREFIX.items():
            values = {g.partition(":")[2] for g in self.grants if g.partition(":")[0] == prefix}
            if "*" not in values:
                allowed.append((part, frozenset(values)))
        return Visibility(tuple(allowed))

    def may_touch(self, scope: Scope) -> bool:
        return self.visibility.admits(scope.user_id, scope.agent_id, scope.run_id)

    def require(self, action: str, scope: Scope | None = None) -> None:
        """Raise Forbidden unless this principal may do `action` (in `scope`, when given)."""
        if not self.may(action):
            raise Forbidden(f"role {self.role!r} may not {action}")
        if scope is not None and not self.may_touch(scope):
            raise Forbidden("this API key may not touch that scope")


def new_key() -> str:
    return "engram_" + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def check_grants(grants: list[str]) -> list[str]:
    """Validate grant strings; raise ValidationFailed on a malformed one."""
    for grant in grants:
        if grant == "*":
            continue
        prefix, _, value = grant.partition(":")
        if prefix not in _PREFIX.values() or not value:
            raise ValidationFailed(f"bad scope grant {grant!r}: use '*', 'user:<id>', 'agent:<id>' or 'run:<id>'")
    return grants


# The write pipeline, when its model's decisions change a fact: an automatic actor (a person's
# lock holds it off) in every scope, which only ever acts on the scope of the memory it works on.
PIPELINE = Principal(id="system:pipeline", name="pipeline", role="agent", grants=("*",))
