"""bench.search_ab's arguments and report, on made-up runs (the benchmark itself runs two services)."""

from __future__ import annotations

import argparse
import contextlib

import pytest

from bench import peer_mem0, search_ab


def test_a_side_setting_must_be_one_of_the_services_settings_with_a_value():
    assert search_ab.setting("ENGRAM_INDEX_SEARCH_THREADS=1") == ("ENGRAM_INDEX_SEARCH_THREADS", "1")
    assert search_ab.setting("ENGRAM_QDRANT_URL=http://q?a=b") == ("ENGRAM_QDRANT_URL", "http://q?a=b")
    # not a setting (the service would ignore it), misspelled, or no value
    for bad in ("INDEX_SEARCH_THREADS=1", "ENGRAM_INDEX_SEARCH_THREAD=1", "ENGRAM_INDEX_SEARCH_THREADS"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected ENGRAM_NAME=value"):
            search_ab.setting(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="set by the benchmark for each side"):
        search_ab.setting("ENGRAM_DATA_DIR=/tmp/x")


def test_a_side_may_not_name_a_setting_twice_nor_time_more_questions_than_there_are(capsys):
    with pytest.raises(SystemExit):
        search_ab.main(["--name", "x", "--a", "ENGRAM_INDEX_SEARCH_THREADS=1", "--a", "ENGRAM_INDEX_SEARCH_THREADS=2"])
    assert "--a names a setting twice" in capsys.readouterr().err
    most = len(peer_mem0.questions()) - peer_mem0.WARMUP
    with pytest.raises(SystemExit):
        search_ab.main(["--name", "x", "--queries", str(most + 1)])
    assert f"between {peer_mem0.BLOCK} and {most}" in capsys.readouterr().err


def test_a_kept_directory_is_loaded_and_settled_if_new_or_empty_reused_if_it_holds_that_size_and_refused_otherwise(
        tmp_path, monkeypatch):
    loads = []

    def load(data, size):
        loads.append(data)
        (data / search_ab.LOADED).write_text(str(size))
        return 12.0

    settled = []
    monkeypatch.setattr(search_ab, "load", load)
    monkeypatch.setattr(search_ab.scale_corpus, "settle", settled.append)
    new, empty, old, other, unmarked = (tmp_path / name for name in ("new", "empty", "old", "other", "unmarked"))
    empty.mkdir()
    assert search_ab.store(new, 2_000, contextlib.ExitStack()) == (new, 12.0)
    assert search_ab.store(empty, 2_000, contextlib.ExitStack()) == (empty, 12.0)
    assert search_ab.store(new, 2_000, contextlib.ExitStack()) == (new, None)  # reused as it is
    assert loads == [new, empty] and settled == [new, empty]
    old.mkdir()
    (old / search_ab.LOADED).write_text("2000")  # loaded by a run that did not settle its stores
    assert search_ab.store(old, 2_000, contextlib.ExitStack()) == (old, None)
    assert search_ab.store(old, 2_000, contextlib.ExitStack()) == (old, None)
    assert settled == [new, empty, old]  # settled once, then reused
    other.mkdir()
    (other / search_ab.LOADED).write_text("10000")
    unmarked.mkdir()
    (unmarked / "postgres").mkdir()  # a load that stopped partway
    for path in (other, unmarked):
        with pytest.raises(SystemExit, match="other than a store of 2000"):
            search_ab.store(path, 2_000, contextlib.ExitStack())
    assert loads == [new, empty]


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
                                                                   "load_avg": (0.5, 1.5), "optimisations": [0, 1]})
    assert "`ENGRAM_INDEX_SEARCH_THREADS=8`" in body and "| B | defaults |" in body
    assert "| **B / A** |  | **0.90×** | **0.90×** | **0.90×** | **0.90×** | 0.90× |" in body
    assert "p50 0.90-0.90×" in body  # every block of B is 0.9 of A's
    assert "loaded in 95 s" in body
    assert "begun from the warm pass's end to the last search (a child process competing with the searches for the " \
           "cores): A 0, B 1" in body
    assert "a warm pass" in body
