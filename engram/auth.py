"""Principals, roles and scope grants.

A key's grants are strings: `*` (every scope), `user:<id>`, `agent:<id>`, `run:<id>`, where
`<id>` may be `*`. A request scope is allowed when each of its parts is granted.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from engram.errors import Forbidden, ValidationFailed
from engram.models import Scope

ROLES = ("reader", "writer", "admin")
# What each role may do; a role may do everything the roles before it may.
_ACTIONS = {"reader": {"search", "read"}, "writer": {"search", "read", "remember"}}
_ACTIONS["admin"] = _ACTIONS["writer"] | {"admin"}
_PREFIX = {"user_id": "user", "agent_id": "agent", "run_id": "run"}


@dataclass(frozen=True)
class Principal:
    id: str
    role: str
    grants: tuple[str, ...]

    def may(self, action: str) -> bool:
        return action in _ACTIONS[self.role]

    def may_touch(self, scope: Scope) -> bool:
        if "*" in self.grants:
            return True
        for part, prefix in _PREFIX.items():
            value = getattr(scope, part)
            if value is not None and f"{prefix}:{value}" not in self.grants and f"{prefix}:*" not in self.grants:
                return False
        return True

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
