"""Context expansion looks up neighbours only for the candidates a lift could bring into the
results: the best `places` come out exactly as if every candidate had been lifted."""

from __future__ import annotations

import random
import uuid

import pytest

from engram.recall import expansion


def _final_order(fused, access, neighbours, weight, access_weight):
    lift = expansion.lifts(fused, neighbours, weight)
    score = {k: fused[k] + lift[k] + access_weight * access[k] for k in fused}
    return sorted(fused, key=lambda k: (-score[k], str(k))), score


@pytest.mark.parametrize("seed", range(300))
def test_the_best_places_are_those_every_lift_would_give(seed):
    rng = random.Random(seed)
    ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(rng.randint(1, 60))]
    # Ties are common in real scores (a memory found by one leg only scores 0 in the other).
    fused = {k: rng.choice([0.0, 0.5, 1.0, rng.random(), rng.random()]) for k in ids}
    access = {k: rng.choice([0.0, 0.0, rng.random() * 3]) for k in ids}
    around = {k: tuple(rng.sample(ids + [uuid.uuid4()] * 3, k=rng.randint(0, 2))) for k in ids}
    weight, access_weight = rng.choice([0.1, 0.3, 1.0]), rng.choice([0.0, 0.02])
    places = rng.randint(1, 25)

    everyone, want = _final_order(fused, access, around, weight, access_weight)
    base = {k: fused[k] + access_weight * access[k] for k in ids}
    rising = expansion.could_rise(base, fused, weight, places)
    pruned, got = _final_order(fused, access, {k: around[k] for k in rising}, weight, access_weight)

    assert pruned[:places] == everyone[:places]
    assert [got[k] for k in pruned[:places]] == [want[k] for k in everyone[:places]]


def test_with_no_weight_nothing_is_looked_up():
    fused = {uuid.uuid4(): 0.5 for _ in range(5)}
    assert expansion.could_rise(fused, fused, 0.0, 3) == []
