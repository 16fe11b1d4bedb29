"""Stage 2: fusion. Each leg's scores min-max normalised over the candidates, then weighted."""

from __future__ import annotations

from uuid import UUID

from engram.recall.candidates import Candidate


def minmax(values: dict[UUID, float | None]) -> dict[UUID, float]:
    """Scale to [0, 1] over the present values; a missing value is 0.

    With no range to scale by (one value, or all tied) each value is what the top of a range
    would be: 1 if it carries evidence (> 0), else 0. A lone strong match is not worthless, and
    tied candidates stay tied.
    """
    present = [v for v in values.values() if v is not None]
    if not present:
        return {k: 0.0 for k in values}
    low, high = min(present), max(present)
    span = high - low
    if span == 0:
        return {k: 1.0 if v is not None and v > 0 else 0.0 for k, v in values.items()}
    return {k: (v - low) / span if v is not None else 0.0 for k, v in values.items()}


def fuse(candidates: list[Candidate], vector_weight: float, bm25_weight: float
         ) -> tuple[dict[UUID, float], dict[UUID, float], dict[UUID, float]]:
    """(fused, vector_norm, bm25_norm) per candidate id."""
    vector_norm = minmax({c.id: c.similarity for c in candidates})
    bm25_norm = minmax({c.id: c.bm25 for c in candidates})
    fused = {k: vector_weight * vector_norm[k] + bm25_weight * bm25_norm[k] for k in vector_norm}
    return fused, vector_norm, bm25_norm
