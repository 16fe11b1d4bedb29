"""bench.search_ab's arguments and report, on made-up runs (the benchmark itself runs two services)."""

from __future__ import annotations

import argparse

import pytest

from bench import peer_mem0, search_ab


def test_a_side_setting_must_be_an_engram_variable_with_a_value():
    assert search_ab.setting("ENGRAM_INDEX_SEARCH_THREADS=1") == ("ENGRAM_INDEX_SEARCH_THREADS", "1")
    assert search_ab.setting("ENGRAM_X=a=b") == ("ENGRAM_X", "a=b")
    for bad in ("INDEX_SEARCH_THREADS=1", "ENGRAM_INDEX_SEARCH_THREADS"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected ENGRAM_NAME=value"):
            search_ab.setting(bad)


def _run(label: str, scale: float) -> peer_mem0.Run:
    run = peer_mem0.Run(label, 10_000, "")
    run.search_ms = [scale * (10 + i % 7) for i in range(400)]
    run.search_cpu_ms = 20 * scale
    run.facts["cpu_by_process"] = {"python3.11": 16 * scale, "postgres": 4 * scale}
    return run


def test_the_report_gives_b_over_a_with_its_interval_and_each_sides_settings():
    args = argparse.Namespace(a=[("ENGRAM_INDEX_SEARCH_THREADS", "8")], b=[], size=10_000, queries=400, seed=7,
                              keep=None, cold=False)
    body = search_ab._body(args, _run("A", 1.0), _run("B", 0.9), {"load_s": 95.0, "page_cache_drops": 0,
                                                                   "load_avg": (0.5, 1.5)})
    assert "`ENGRAM_INDEX_SEARCH_THREADS=8`" in body and "| B | defaults |" in body
    assert "| **B / A** |  | **0.90×** | **0.90×** | **0.90×** | **0.90×** | 0.90× |" in body
    assert "p50 0.90-0.90×" in body  # every block of B is 0.9 of A's
    assert "loaded in 95 s" in body
    assert "a warm pass" in body
