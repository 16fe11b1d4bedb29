"""Stage 3 (optional): context expansion. A memory is lifted a little by its neighbours written
just before and after it in the same scope and session: a conversation's turns answer together.

The neighbours are read with the candidates' rows, among live memories of the same scope and
session only, so expansion never crosses a scope and never brings back a deleted memory; it
only re-weights candidates that stage 1 already admitted."""

from __future__ import annotations

import heapq
from uuid import UUID


def could_rise(base: dict[UUID, float], fused: dict[UUID, float], weight: float, places: int) -> list[UUID]:
    """The candidates a lift could put among the best `places` by final score (base + lift): a
    lift is at most weight × the two best fused scores, so a candidate whose base falls short
    of the places-th best base by more than that can never get there. Only these are lifted.
    The neighbours of every candidate are read with its row now (memories.candidate_rows), so
    this no longer saves a lookup; lifting the rest would change no result, only their scores
    below the results."""
    if weight == 0 or not base:
        return []
    ceiling = weight * sum(heapq.nlargest(2, fused.values()))
    floor = heapq.nlargest(places, base.values())[-1]
    return [k for k, v in base.items() if v + ceiling >= floor - 1e-9]  # a rounding never hides one


def lifts(fused: dict[UUID, float], neighbours: dict[UUID, tuple[UUID, ...]], weight: float) -> dict[UUID, float]:
    """weight × (fused score of the previous turn + of the next turn), for each candidate in
    `neighbours`; a neighbour that is not a candidate contributes 0, and a candidate whose
    neighbours were not looked up gets no lift."""
    lift = dict.fromkeys(fused, 0.0)
    if weight:
        for k, around in neighbours.items():
            lift[k] = weight * sum(fused.get(n, 0.0) for n in around)
    return lift
