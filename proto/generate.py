"""Generate the gRPC API's Python modules from proto/ (`make proto`), into the repository root
or the directory given: `python proto/generate.py [OUT]`.

The .proto's path under proto/ is the generated package's path (engram_grpc/memory/v1/), so the
generated `_pb2_grpc` module's absolute import of its `_pb2` resolves inside our own package, not
in `engram`. The output is committed; tests/test_grpc.py regenerates it into a temporary
directory and checks that nothing differs. Needs grpcio-tools (the `test` extra).
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
SOURCES = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Write `<name>_pb2.py`, `.pyi` and `_pb2_grpc.py` of every .proto under proto/ into `out`
    (at their packages' paths); return the files written. Raises RuntimeError if protoc fails."""
    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto, as grpcio-tools ships them
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *SOURCES]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(SOURCES)}")
    return sorted(out / Path(source).with_name(Path(source).stem + suffix)
                  for source in SOURCES for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT.parent):
        print(path)
