"""Stage 3 (optional): context expansion. A memory is lifted a little by its neighbours written
just before and after it in the same scope and session: a conversation's turns answer together.

The neighbours are looked up among live memories of the same scope and session only, so
expansion never crosses a scope and never brings back a deleted memory; it only re-weights
candidates that stage 1 already admitted."""

from __future__ import annotations

from uuid import UUID

from engram.recall.candidates import Candidate


def lifts(candidates: list[Candidate], fused: dict[UUID, float], weight: float) -> dict[UUID, float]:
    """weight × (fused score of the previous turn + of the next turn), per candidate; the
    neighbours come with the candidates (`candidates.rows(..., neighbours=True)`).
    A neighbour that is not a candidate contributes 0."""
    if weight == 0:
        return {c.id: 0.0 for c in candidates}
    return {c.id: weight * sum(fused.get(n, 0.0) for n in c.neighbours) for c in candidates}
