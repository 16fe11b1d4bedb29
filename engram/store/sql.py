"""Assembling WHERE clauses from fixed fragments. Only values are parameters; no user text
ever becomes SQL."""

from __future__ import annotations

from engram.domain.auth import Visibility
from engram.domain.filters import Filters
from engram.domain.models import Scope


class Where:
    """Collects `AND`-ed clauses and their positional parameters."""

    @classmethod
    def ids_in_scope(cls, ids: list, scope: Scope, filters: Filters, *params) -> "Where":
        """`m.id = ANY($1)` inside `scope` and `filters`; `params` follow as $2, $3, ..."""
        where = cls([ids, *params])
        where.add_raw("m.id = ANY($1::uuid[])")
        where.scope(scope, "m")
        where.filters(filters)
        return where

    def __init__(self, params: list | None = None) -> None:
        self.clauses: list[str] = []
        self.params: list = params if params is not None else []

    def add(self, fragment: str, *values) -> None:
        """`fragment` holds one `{}` per value, where that value's placeholder goes."""
        placeholders = []
        for value in values:
            self.params.append(value)
            placeholders.append(f"${len(self.params)}")
        self.clauses.append(fragment.format(*placeholders))

    def add_raw(self, fragment: str) -> None:
        self.clauses.append(fragment)

    def scope(self, scope: Scope, alias: str) -> None:
        for name in ("user_id", "agent_id", "run_id"):
            value = getattr(scope, name)
            if value is not None:
                self.add(f"{alias}.{name} = {{}}", value)

    def visible(self, visibility: Visibility, alias: str) -> None:
        """Only rows whose scope the caller may touch: each restricted part null or granted."""
        for part, values in visibility.allowed:
            self.add(f"({alias}.{part} IS NULL OR {alias}.{part} = ANY({{}}::text[]))", sorted(values))

    def filters(self, filters: Filters, alias: str = "m") -> None:
        """Every one of `filters` on the memories row `alias`."""
        self.visible(filters.visible, alias)
        if filters.status is not None:
            self.add(f"{alias}.status = {{}}", filters.status)
        else:
            if not filters.include_deleted:
                self.add_raw(f"NOT {alias}.is_deleted")
            # Quarantined: its row no longer matches its history; pending: it waits for approval.
            hidden = "quarantined" if filters.include_pending else "quarantined,pending"
            self.add_raw(f"{alias}.status <> ALL('{{{hidden}}}'::text[])")
        if not filters.include_expired and filters.now is not None:
            self.add(f"({alias}.expires_at IS NULL OR {alias}.expires_at > {{}})", filters.now)
        if filters.memory_types:
            self.add(f"{alias}.memory_type = ANY({{}}::text[])", list(filters.memory_types))
        if filters.trust:
            self.add(f"{alias}.trust = ANY({{}}::text[])", list(filters.trust))
        if filters.min_confidence is not None:
            self.add(f"{alias}.confidence >= {{}}", filters.min_confidence)
        if filters.kind is not None:
            self.add(f"{alias}.kind = {{}}", filters.kind)
        if filters.type is not None:
            self.add(f"{alias}.type = {{}}", filters.type)
        if filters.tags:
            self.add(f"{alias}.tags && {{}}::text[]", list(filters.tags))
        if filters.who is not None:
            self.add(f"{alias}.who = {{}}", filters.who)
        if filters.source_type is not None:
            self.add(f"{alias}.source_type = {{}}", filters.source_type)
        if filters.created_from is not None:
            self.add(f"{alias}.created_at >= {{}}", filters.created_from)
        if filters.created_to is not None:
            self.add(f"{alias}.created_at < {{}}", filters.created_to)

    def sql(self) -> str:
        return " AND ".join(self.clauses) if self.clauses else "TRUE"
