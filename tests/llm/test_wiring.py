"""How `ENGRAM_LLM_PROVIDER=local` is wired, without the model: these run in `make test`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from engram.domain.errors import ConfigError, ModelFileMismatch
from engram.inference import local_llm
from engram.inference.providers import OpenAIProvider, build_provider_chain
from engram.settings import Settings
from worker.local_llm import local_llm_server

ENGRAM = str(Path(sys.executable).parent / "engram")


def test_the_local_provider_asks_the_local_server_for_the_model_it_serves():
    (provider,) = build_provider_chain(Settings(llm_provider="local", llm_secondary="none", local_llm_port=18123))

    assert isinstance(provider, OpenAIProvider)
    assert provider.base_url == "http://127.0.0.1:18123/v1"
    assert provider.model == local_llm.MODEL_NAME


def test_the_local_provider_waits_longer_and_only_adds_facts_unless_told_otherwise(monkeypatch):
    for name in ("ENGRAM_LLM_PROVIDER", "ENGRAM_WRITE_PIPELINE", "ENGRAM_LLM_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    local = Settings(llm_provider="local")
    assert (local.llm_timeout_s, local.write_pipeline) == (120.0, "add_only")
    other = Settings(llm_provider="ollama")
    assert (other.llm_timeout_s, other.write_pipeline) == (20.0, "full")
    monkeypatch.setenv("ENGRAM_LLM_PROVIDER", "local")
    monkeypatch.setenv("ENGRAM_WRITE_PIPELINE", "full")
    monkeypatch.setenv("ENGRAM_LLM_TIMEOUT_S", "45")
    chosen = Settings()
    assert (chosen.llm_timeout_s, chosen.write_pipeline) == (45.0, "full")


def test_the_local_provider_is_held_to_the_allowlist():
    with pytest.raises(ConfigError, match="not in ENGRAM_PROVIDER_ALLOWLIST"):
        build_provider_chain(Settings(llm_provider="local", provider_allowlist=["127.0.0.1:11434"]))


def test_the_model_file_defaults_to_the_data_directory(tmp_path):
    assert local_llm.model_path(Settings(data_dir=tmp_path)) == tmp_path / "models" / local_llm.MODEL_FILE
    assert local_llm.model_path(Settings(local_llm_model_path=tmp_path / "m.gguf")) == tmp_path / "m.gguf"


def test_a_missing_model_file_is_refused_naming_make_llm(tmp_path):
    with pytest.raises(ConfigError, match="no local LLM model file at .*make llm"):
        local_llm.check(tmp_path / "absent.gguf")


def test_a_model_file_that_is_not_the_pinned_one_is_refused(tmp_path):
    forged = tmp_path / local_llm.MODEL_FILE
    forged.write_bytes(b"GGUF" + b"\0" * 1024)

    with pytest.raises(ModelFileMismatch, match=f"expected {local_llm.MODEL_SHA256}; delete it and run `make llm`"):
        local_llm.check(forged)


def test_engram_up_runs_no_model_server_unless_a_provider_is_local(tmp_path):
    assert local_llm_server(Settings(data_dir=tmp_path, llm_provider="ollama", llm_secondary="none")) is None
    with pytest.raises(ConfigError, match="make llm"):
        local_llm_server(Settings(data_dir=tmp_path, llm_provider="none", llm_secondary="local"))


def test_engram_up_without_the_model_stops_before_starting_anything(tmp_path):
    data_dir = tmp_path / "data"
    env = {**os.environ, "ENGRAM_DATA_DIR": str(data_dir), "ENGRAM_LLM_PROVIDER": "local",
           "ENGRAM_LOCAL_LLM_MODEL_PATH": str(tmp_path / "absent.gguf")}

    result = subprocess.run([ENGRAM, "up"], env=env, capture_output=True, text=True, timeout=120)

    assert result.returncode == 1
    assert f"engram up: no local LLM model file at {tmp_path / 'absent.gguf'}: run `make llm`" in result.stderr
    assert not (data_dir / "postgres").exists()


def test_the_server_runs_in_a_process_of_its_own_with_this_interpreter(tmp_path):
    command = local_llm.server_command(tmp_path / "m.gguf", 18123, 3)

    assert command[:3] == [sys.executable, "-m", "engram.inference.local_llm"]
    assert command[3:] == ["serve", "--model", str(tmp_path / "m.gguf"), "--port", "18123", "--threads", "3"]


def test_the_server_listens_on_loopback_with_one_4096_token_slot(tmp_path):
    params = SimpleNamespace(model=SimpleNamespace(), cpuparams=SimpleNamespace(), cpuparams_batch=SimpleNamespace())

    local_llm.server_params(params, tmp_path / "m.gguf", 18123, 3)

    assert (params.hostnames, params.port, params.model.path) == (["127.0.0.1"], 18123, str(tmp_path / "m.gguf"))
    assert (params.n_ctx, params.n_parallel, params.model_alias) == (4096, 1, {local_llm.MODEL_NAME})
    assert params.cpuparams.n_threads == params.cpuparams_batch.n_threads == 3
