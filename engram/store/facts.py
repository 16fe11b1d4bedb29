"""SQL for the semantic write pipeline: a fact's candidates in its scope, the decisions taken
about each fact, and lineage (which facts came from which memories)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import numpy as np

from engram.domain import provenance
from engram.domain.models import Scope


@dataclass(frozen=True)
class Candidate:
    """A live fact of the scope near a new fact, as it was when read."""

    id: UUID
    content: str
    version: int
    similarity: float
    sensitive: tuple[str, ...] = ()  # secrets it holds that no pattern may find
    trust: str = "TRUSTED"


async def nearest_facts(conn: asyncpg.Connection | asyncpg.Pool, scope: Scope, vector: np.ndarray, model: str,
                        limit: int) -> list[Candidate]:
    """The `limit` live facts of exactly `scope` nearest to `vector` (exact cosine over their
    canonical embeddings, so a fact written a moment ago is already a candidate)."""
    rows = await conn.fetch(
        """
        SELECT id, content, version, 1 - (embedding <=> $4) AS similarity, sensitive, trust
        FROM memories
        WHERE scope_key = engram_scope_key($1, $2, $3) AND kind = 'fact' AND NOT is_deleted
          AND status = 'active' AND embedding_model = $5 AND (expires_at IS NULL OR expires_at > now())
        ORDER BY embedding <=> $4 LIMIT $6
        """,
        scope.user_id, scope.agent_id, scope.run_id, vector, model, limit,
    )
    return [Candidate(r["id"], r["content"], r["version"], r["similarity"], tuple(r["sensitive"]), r["trust"])
            for r in rows]


async def decided(conn: asyncpg.Connection | asyncpg.Pool, source_id: UUID) -> set[str]:
    """The hashes of the facts of `source_id` already decided."""
    rows = await conn.fetch("SELECT fact_hash FROM memory_decisions WHERE source_memory_id = $1", source_id)
    return {r["fact_hash"] for r in rows}


async def record(conn: asyncpg.Connection, scope: Scope, **row: Any) -> int | None:
    """Record one decision (the columns of memory_decisions but scope_key) about a fact of a
    memory of `scope`: its id, or None when the fact was decided already (another run of the
    step got there first: the caller's transaction then rolls back)."""
    names = sorted(row)
    placeholders = ", ".join(f"${i}" for i in range(4, len(names) + 4))
    inserted = await conn.fetchval(
        f"""
        INSERT INTO memory_decisions ({", ".join(names)}, scope_key)
        VALUES ({placeholders}, engram_scope_key($1, $2, $3))
        ON CONFLICT (source_memory_id, fact_hash) DO NOTHING RETURNING id
        """,
        scope.user_id, scope.agent_id, scope.run_id, *(row[name] for name in names),
    )
    return inserted


async def add_source(conn: asyncpg.Connection, memory_id: UUID, source_id: UUID) -> None:
    """`source_id` supports the fact `memory_id` too (an UPDATE of it, a MERGE onto it): the
    fact takes the lower trust of the two (and an UNTRUSTED one's confidence cap); its index
    points are rewritten when that changes it."""
    await conn.execute(
        """
        UPDATE memories f SET derived_from = array_append(f.derived_from, s.id),
            trust = CASE WHEN lower_trust THEN s.trust ELSE f.trust END,
            confidence = CASE WHEN s.trust = 'UNTRUSTED' THEN least(f.confidence, $4) ELSE f.confidence END,
            dense_stale = f.dense_stale OR lower_trust,
            lexical_indexed = f.lexical_indexed AND NOT lower_trust
        FROM memories s
        CROSS JOIN LATERAL (SELECT array_position($3::text[], s.trust)
                                   < array_position($3::text[], (SELECT trust FROM memories WHERE id = $1))
                            AS lower_trust) t
        WHERE f.id = $1 AND s.id = $2 AND f.kind = 'fact' AND NOT (s.id = ANY(f.derived_from))
        """,
        memory_id, source_id, list(provenance.TRUST_LEVELS), provenance.UNTRUSTED_CONFIDENCE_CAP,
    )
    await note_facts(conn, source_id)


async def note_facts(conn: asyncpg.Connection, source_id: UUID) -> None:
    """The raw memory `source_id` has a fact taken from it (search ranks it below its facts)."""
    await conn.execute("UPDATE memories SET has_facts = true WHERE id = $1 AND kind = 'raw' AND NOT has_facts",
                       source_id)


async def set_entities(conn: asyncpg.Connection, memory_id: UUID, entities: list[dict]) -> None:
    """The extraction's entities the fact mentions (its `entities`)."""
    await conn.execute("UPDATE memories SET entities = $2 WHERE id = $1", memory_id, entities)


async def set_sensitive(conn: asyncpg.Connection, memory_id: UUID, secrets: list[str]) -> None:
    """The secrets restored into the memory's content (its `sensitive`)."""
    await conn.execute("UPDATE memories SET sensitive = $2 WHERE id = $1", memory_id, secrets)


async def mark_stale(conn: asyncpg.Connection, memory_id: UUID) -> None:
    """The index owner writes the memory's vector points (engram.changes' mechanism)."""
    await conn.execute("UPDATE memories SET dense_stale = true WHERE id = $1", memory_id)


async def facts_of(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID) -> list[asyncpg.Record]:
    """The facts derived from `memory_id`, oldest first, deleted ones too."""
    return await conn.fetch(
        "SELECT id, content, version, is_deleted, status FROM memories"
        " WHERE kind = 'fact' AND derived_from @> ARRAY[$1::uuid] ORDER BY created_at, id",
        memory_id,
    )


async def decisions_about(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID) -> list[asyncpg.Record]:
    """Every decision taken on a fact of `memory_id`, naming it as target, or writing it."""
    return await conn.fetch(
        """
        SELECT source_memory_id, fact, fact_type, fact_confidence, action, target_id, memory_id, content,
               confidence, reason, outcome, detail, mode, provider, model, prompt_version, created_at
        FROM memory_decisions
        WHERE source_memory_id = $1 OR target_id = $1 OR memory_id = $1
        ORDER BY id
        """,
        memory_id,
    )


async def decision_counts(pool: asyncpg.Pool, hours: float = 24) -> dict[str, int]:
    """Decisions of the last `hours` by "ACTION outcome" (what `engram status` shows)."""
    rows = await pool.fetch(
        "SELECT action || ' ' || outcome AS key, count(*) AS n FROM memory_decisions"
        " WHERE created_at > now() - make_interval(secs => $1) GROUP BY 1 ORDER BY 1", hours * 3600)
    return {r["key"]: r["n"] for r in rows}


async def reviews_waiting(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM memory_reviews WHERE status IN ('open', 'escalated')")
