"""A benchmark's report replaces the committed one only if it was measured on the same CPU: its model
and its widest int8 instructions."""

from __future__ import annotations

import subprocess

import pytest

from bench import common


@pytest.fixture
def reports(tmp_path, monkeypatch):
    committed, other = tmp_path / "reports", tmp_path / "out" / "reports"
    committed.mkdir()
    monkeypatch.setattr(common, "REPORTS", committed)
    monkeypatch.setattr(common, "OTHER_MACHINE_REPORTS", other)
    monkeypatch.setattr(common, "REPO", tmp_path)
    monkeypatch.setattr(common, "cpu_model", lambda: "This CPU")
    monkeypatch.delenv(common.REPLACE_ENV, raising=False)
    return committed, other


def _committed(directory, name, cpu):
    (directory / f"{name}.md").write_text(f"# a report\n\n- date: then\n- cpu: {cpu}\n- python: 3.11\n\nnumbers\n")


def test_a_report_from_the_same_cpu_model_or_a_new_one_goes_to_bench_reports(reports):
    committed, other = reports
    _committed(committed, "same", "This CPU")
    for name in ("same", "new"):
        path = common.write_report(name, "Title", "body", started=0)
        assert path == committed / f"{name}.md"
        assert "- cpu: This CPU" in path.read_text()
    assert not other.exists()


def test_a_report_from_another_cpu_model_leaves_the_committed_one_alone(reports, capsys):
    committed, other = reports
    _committed(committed, "scale", "That CPU")
    before = (committed / "scale.md").read_text()
    path = common.write_report("scale", "Title", "body", started=0)
    assert path == other / "scale.md" and "body" in path.read_text()
    assert (committed / "scale.md").read_text() == before
    assert common.report_dir("scale") == other  # where the plots beside it go
    assert "'That CPU'" in capsys.readouterr().err


def test_the_replace_variable_replaces_a_report_from_another_cpu_model(reports, monkeypatch):
    committed, other = reports
    _committed(committed, "scale", "That CPU")
    monkeypatch.setenv(common.REPLACE_ENV, "1")
    path = common.write_report("scale", "Title", "body", started=0)
    assert path == committed / "scale.md" and "- cpu: This CPU" in path.read_text()
    assert not other.exists()


@pytest.mark.parametrize(("flags", "level"), [
    ({"avx2", "avx512bw", "avx512_vnni", "avx_vnni"}, "AVX-512 VNNI"),
    ({"avx2", "avx_vnni"}, "AVX-VNNI"),
    ({"avx2", "avx512f", "avx512bw"}, "AVX-512"),
    ({"avx", "avx2", "fma"}, "AVX2"),
    ({"sse4_2"}, "no AVX2"),
])
def test_the_cpu_is_named_with_its_widest_int8_instructions(flags, level):
    assert common.int8_level(flags) == level


def test_a_report_naming_the_model_alone_is_not_replaced_by_one_naming_its_instructions(reports, monkeypatch):
    committed, other = reports
    monkeypatch.setattr(common, "cpu_model", lambda: "AMD EPYC, AVX2")
    _committed(committed, "scale", "AMD EPYC")
    assert common.report_dir("scale") == other


def test_a_report_not_committed_yet_does_not_mark_the_source_as_changed(tmp_path, monkeypatch):
    """A benchmark run right after another wrote its report ran the committed code."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "bench" / "reports").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-q", "-m", "c")
    monkeypatch.setattr(common, "REPO", tmp_path)
    (tmp_path / "bench" / "reports" / "other.md").write_text("numbers\n")
    assert "uncommitted" not in common.machine_facts()["source"]
    (tmp_path / "code.py").write_text("x = 2\n")
    assert common.machine_facts()["source"].endswith("(working tree has uncommitted changes)")
