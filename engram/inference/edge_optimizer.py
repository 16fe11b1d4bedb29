"""Run a qdrant-edge shard's optimiser in a process of its own: `python -m
engram.inference.edge_optimizer <shard directory>`.

`EdgeShard.optimize()` builds the HNSW graphs and merges segments, and holds the GIL for the
seconds that takes. In a serving process that stalls every request, so EdgeIndex.optimize runs
it here, at low priority, on a copy of the shard it then swaps in.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    import qdrant_edge as q

    (path,) = argv
    if hasattr(os, "nice"):
        os.nice(10)  # behind the serving process's searches and embeddings
    shard = q.EdgeShard.load(path, None)
    shard.optimize()
    shard.flush()
    shard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
