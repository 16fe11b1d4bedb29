"""Whether this process's malloc asks the kernel for transparent huge pages (glibc's
`glibc.malloc.hugetlb=1` tunable), as ENGRAM_MALLOC_HUGE_PAGES says.

A search embeds its query with the int8 ONNX model after the core sat idle or ran other work,
so the model's weights (a 34 MB file) come from memory each time, through 4 kB pages whose
translations (two-level in a virtual machine) miss too. In 2 MB pages, one run of bge-small
took 3.6 ms of CPU instead of 5.3 ms after 15 ms idle, and 2.3 instead of 2.9 ms back to back
(2 cores, Xeon). The whole search, at 10k memories in one scope, on against off: p50 0.96x and
p95 0.94x, and with the sides swapped 1/1.05x for both (bench/reports/search-ab-malloc-huge-
pages*.md; each interval touches 1.00). Only
memory glibc's malloc hands out moves: ONNX Runtime's, qdrant-edge's, NumPy's, not Python's
own small-object arenas. The kernel grants it only where transparent huge pages are `always` or
`madvise` (Linux's default); elsewhere, and under another C library, the tunable changes nothing.

glibc reads its tunables once, as a process starts, so the setting is carried in the
environment: `engram up` sets it for its children, and `engram api` / `engram worker` started
with the environment disagreeing restart themselves once, before any work, with it set right.
"""

from __future__ import annotations

import os
import sys

from engram.settings import Settings

TUNABLE = "glibc.malloc.hugetlb"
ON = f"{TUNABLE}=1"


def environment(env: dict[str, str], on: bool) -> dict[str, str]:
    """`env` with GLIBC_TUNABLES holding `glibc.malloc.hugetlb=1` if `on`, else without that
    tunable; its other tunables kept, in order."""
    kept = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t.split("=")[0] != TUNABLE]
    tunables = [*kept, ON] if on else kept
    out = {k: v for k, v in env.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        out["GLIBC_TUNABLES"] = ":".join(tunables)
    return out


def ensure(settings: Settings) -> None:
    """Return if this process started with GLIBC_TUNABLES as `settings.malloc_huge_pages`
    wants it (or is not on Linux); else replace it with itself, started again with the same
    command line and the environment changed only there: this call never returns then. Call it
    before opening anything (files, sockets, threads) that the new process would not inherit."""
    if not sys.platform.startswith("linux"):
        return
    wanted = environment(dict(os.environ), settings.malloc_huge_pages)
    if wanted.get("GLIBC_TUNABLES") == os.environ.get("GLIBC_TUNABLES"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, wanted)
