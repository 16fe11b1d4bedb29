"""The layout is kept by tools, not by memory: import-linter's contracts (pyproject.toml) hold,
and the package as built and installed (a wheel, not the source tree) imports and runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engram", "engram_grpc", "api", "worker", "workflows", "activities")


def test_import_contracts_hold():
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"an import contract is broken:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
    assert "0 broken" in result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of what the Dockerfile copies: setuptools leaves build/ beside its source.
    source = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", source)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"the wheel did not build:\n{result.stdout}\n{result.stderr}"
    (built,) = out.glob("engram-*.whl")
    return built


def test_wheel_holds_every_package_of_the_source_tree_and_its_sql(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        for init in (ROOT / package).rglob("__init__.py"):
            assert str(init.relative_to(ROOT)) in names, f"the wheel lacks the package {init.parent.relative_to(ROOT)}"
    migrations = sorted(p.name for p in (ROOT / "engram/store/migrations").glob("*.sql"))
    assert [n for n in sorted(names) if n.startswith("engram/store/migrations/")] == [
        f"engram/store/migrations/{m}" for m in migrations]
    assert "engram/store/schema.sql" in names


def test_installed_wheel_imports_every_module_and_runs_the_cli(wheel, tmp_path):
    """What `pip install .` puts in the image, in a fresh virtual environment. Its dependencies
    come from this environment's site-packages as a plain path entry (no .pth of ours is read,
    so the editable install of the source tree is not visible) and the source tree is not on
    the path: every module must come from the wheel."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr

    probe = f"""
import importlib, pkgutil, sys
from pathlib import Path
site = Path({str(site)!r})
for name in {PACKAGES!r}:
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        module = importlib.import_module(info.name)
        assert Path(module.__file__).is_relative_to(site), f"{{info.name}} came from {{module.__file__}}"
    print(name, "ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    imported = subprocess.run([str(python), "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env=env)
    assert imported.returncode == 0, f"a module of the installed wheel does not import:\n{imported.stderr[-4000:]}"
    assert imported.stdout.split() == [word for name in PACKAGES for word in (name, "ok")]

    helped = subprocess.run([str(venv / "bin" / "engram"), "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=env)
    assert helped.returncode == 0, helped.stderr
    assert all(command in helped.stdout for command in ("up", "worker", "api", "remember", "search", "keys"))
