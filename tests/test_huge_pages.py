"""ENGRAM_MALLOC_HUGE_PAGES: the API and worker processes start with glibc's malloc asking for
transparent huge pages, or without, as the setting says, whatever environment they were started
in; the process's other glibc tunables are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker import huge_pages

# Run as `python -c`: worker.huge_pages.ensure starts the same command line again when it must.
PROBE = """
import ctypes, json, os
from engram.settings import Settings
from worker import huge_pages
huge_pages.ensure(Settings())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(64 << 20)  # 64 MB from glibc's malloc (NumPy would ask for huge pages itself)
ctypes.memset(block, 1, 64 << 20)  # every page touched
with open("/proc/self/smaps") as smaps:
    huge_kb = sum(int(line.split()[1]) for line in smaps if line.startswith("AnonHugePages:"))
print(json.dumps({"tunables": os.environ.get("GLIBC_TUNABLES"), "huge_kb": huge_kb}))
"""


def _probe(env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "ENGRAM_MALLOC_HUGE_PAGES")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _kernel_grants_huge_pages() -> bool:
    """Transparent huge pages `always` or `madvise` (the selected mode is in brackets)."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[never]" not in path.read_text()


def test_the_environment_gains_or_loses_the_tunable_and_keeps_the_others():
    env = {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"}
    on = huge_pages.environment(env, True)
    assert on == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    assert huge_pages.environment(on, True) == on
    assert huge_pages.environment(on, False) == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert huge_pages.environment({"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, False) == {
        "PATH": "/bin"}
    assert huge_pages.environment({}, True) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert "GLIBC_TUNABLES" not in huge_pages.environment({}, False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc tunable: Linux only")
def test_a_process_started_without_the_tunable_restarts_itself_with_it_and_its_malloc_gets_huge_pages():
    probe = _probe({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    assert probe["tunables"] == "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1"
    if _kernel_grants_huge_pages():
        assert probe["huge_kb"] >= 32 << 10  # most of the 64 MB block sits in 2 MB pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc tunable: Linux only")
def test_turned_off_a_process_started_with_the_tunable_restarts_itself_without_it():
    probe = _probe({"ENGRAM_MALLOC_HUGE_PAGES": "false", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert probe["tunables"] is None
    assert probe["huge_kb"] == 0
