"""What a read may return: the one filters type the store and the vector index both apply.

A request states its filters on the wire (`SearchFilters`: a time phrase, a time range, ...);
`resolve` turns them, with the caller's visibility, into `Filters`, which every read path
applies whole: SQL (engram.store.sql.Where.filters) and the vector index alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engram.domain.auth import Visibility
from engram.domain.chain import real
from engram.domain.models import SearchFilters
from engram.domain.timephrase import parse_time_phrase


@dataclass(frozen=True)
class Filters:
    """Resolved filters. `visible` is the caller's: no read returns a memory whose scope it may
    not touch. Created in [created_from, created_to)."""

    visible: Visibility
    kind: str | None = None  # raw or fact; None: both
    type: str | None = None
    tags: list[str] | None = None
    who: str | None = None
    source_type: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    include_deleted: bool = False
    # Only memories of this status (a list's filter). None: live ones (deleted ones too with
    # include_deleted), never quarantined or pending ones.
    status: str | None = None
    memory_types: list[str] | None = None
    trust: list[str] | None = None
    min_confidence: float | None = None
    # Memories past their lifetime (expires_at at or before `now`) only with include_expired.
    include_expired: bool = False
    now: datetime | None = None
    # Writes waiting for approval too (a forget selects what is stored, not what recall shows).
    include_pending: bool = False


def resolve(asked: SearchFilters, visible: Visibility, *, include_deleted: bool, now: datetime,
            status: str | None = None, include_expired: bool = False, include_pending: bool = False) -> Filters:
    """The filters a caller asked for, within what it may see. A time phrase and a time range
    together mean both (their intersection). Raises ValidationFailed for a phrase it cannot read."""
    start = end = None
    if asked.time is not None:
        start, end = parse_time_phrase(asked.time, now)
    if asked.time_range is not None:
        start = max(filter(None, [start, asked.time_range.start]), default=None)
        end = min(filter(None, [end, asked.time_range.end]), default=None)
    return Filters(visible=visible, kind=asked.kind, type=asked.type, tags=asked.tags, who=asked.who,
                   source_type=asked.source_type,
                   created_from=start, created_to=end, include_deleted=include_deleted, status=status,
                   memory_types=asked.memory_type, trust=asked.trust,
                   # As a `real` holds it: a memory of confidence 0.7 has 0.699999988 (Postgres and the index).
                   min_confidence=None if asked.min_confidence is None else real(asked.min_confidence),
                   include_expired=include_expired, now=now, include_pending=include_pending)
