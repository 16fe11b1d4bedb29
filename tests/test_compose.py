"""docker-compose.yml and the Dockerfile against the code they run: every ENGRAM_* variable is a
real setting, the api's settings point at the compose services and pass the provider rules, the
commands are real CLI subcommands. No container runs: the file is read with PyYAML."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from api.cli import build_parser
from engram.inference.providers import build_provider_chain
from engram.inference.vector_index import QdrantServerIndex
from engram.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"postgres", "qdrant", "temporal", "temporal-ui", "ollama", "api", "worker"}
ENGRAM_SERVICES = ("api", "worker")
SERVERS = ("postgres", "temporal", "qdrant")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def environment(service: dict) -> dict:
    """A service's environment as a dict, from either the mapping or the `KEY=VALUE` list form."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return dict(env)


def container_ports(service: dict) -> set[int]:
    """The ports a service listens on inside the network: targets of `ports`, plus `expose`."""
    found = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            found.add(int(entry["target"]))
            continue
        assert isinstance(entry, str), (
            f"port mapping {entry!r} is not quoted: YAML 1.1 reads an unquoted 'a:b' as a base-60 number")
        found.add(int(entry.rsplit(":", 1)[-1].split("/")[0]))
    found.update(int(str(port).split("/")[0]) for port in service.get("expose", []))
    return found


def published_ports(service: dict) -> set[int]:
    """The host ports a service is published on (short syntax `[ip:]host:container`, or long syntax)."""
    found = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            if "published" in entry:
                found.add(int(entry["published"]))
        elif entry.count(":") >= 1:
            found.add(int(entry.split("/")[0].split(":")[-2]))
    return found


def command(service: dict) -> list[str]:
    cmd = service.get("command", [])
    return cmd.split() if isinstance(cmd, str) else list(cmd)


def dockerfile_entrypoint() -> list[str]:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            return json.loads(line.removeprefix("ENTRYPOINT"))
    raise AssertionError("the Dockerfile has no ENTRYPOINT")


@pytest.fixture
def api_settings(services, monkeypatch) -> Settings:
    """Settings as the api container reads them: from its environment only, through pydantic-settings."""
    for name in list(os.environ):
        if name.startswith("ENGRAM_"):
            monkeypatch.delenv(name)
    for name, value in environment(services["api"]).items():
        monkeypatch.setenv(name, str(value))
    return Settings()


def test_compose_defines_the_seven_services(services):
    missing = SERVICES - set(services)
    assert not missing, f"docker-compose.yml lacks the services {sorted(missing)}"


@pytest.mark.parametrize("name", ENGRAM_SERVICES)
def test_every_engram_variable_names_a_setting(services, name):
    env = environment(services[name])
    assert any(key.startswith("ENGRAM_") for key in env), f"{name} sets no ENGRAM_* variable at all"
    for key, value in env.items():
        if not key.startswith("ENGRAM_"):
            continue
        field = key.removeprefix("ENGRAM_").lower()
        assert field in Settings.model_fields, (
            f"{name} sets {key}, but Settings has no field {field!r}: pydantic-settings would silently ignore it")
        assert isinstance(value, (str, int, float)) and not isinstance(value, bool), (
            f"{name} sets {key} to the YAML {type(value).__name__} {value!r}; compose wants it quoted as a string")


def test_api_settings_point_at_the_compose_services(services, api_settings):
    pg_env = environment(services["postgres"])
    dsn = urlsplit(api_settings.postgres_dsn)
    assert dsn.hostname == "postgres", f"ENGRAM_POSTGRES_DSN points at host {dsn.hostname!r}, not the postgres service"
    assert dsn.port in (None, 5432), f"ENGRAM_POSTGRES_DSN uses port {dsn.port}; the postgres service listens on 5432"
    assert dsn.username == pg_env["POSTGRES_USER"], (
        f"ENGRAM_POSTGRES_DSN logs in as {dsn.username!r}, but the postgres service creates {pg_env['POSTGRES_USER']!r}")
    assert dsn.password == pg_env["POSTGRES_PASSWORD"], (
        "ENGRAM_POSTGRES_DSN's password differs from the postgres service's POSTGRES_PASSWORD")
    assert dsn.path.lstrip("/") == pg_env["POSTGRES_DB"], (
        f"ENGRAM_POSTGRES_DSN names database {dsn.path!r}, but the postgres service creates {pg_env['POSTGRES_DB']!r}")

    host, _, port = api_settings.temporal_address.rpartition(":")
    assert host == "temporal", f"ENGRAM_TEMPORAL_ADDRESS points at host {host!r}, not the temporal service"
    assert int(port) in container_ports(services["temporal"]), (
        f"ENGRAM_TEMPORAL_ADDRESS uses port {port}, which the temporal service does not expose "
        f"({sorted(container_ports(services['temporal']))})")

    for setting, service in (("qdrant_url", "qdrant"), ("ollama_url", "ollama")):
        url = urlsplit(getattr(api_settings, setting))
        assert url.hostname == service, f"ENGRAM_{setting.upper()} points at {url.hostname!r}, not the {service} service"
        assert url.port in container_ports(services[service]), (
            f"ENGRAM_{setting.upper()} uses port {url.port}, which the {service} service does not expose "
            f"({sorted(container_ports(services[service]))})")


def test_temporal_and_its_ui_use_the_compose_servers(services, api_settings):
    pg_env, temporal_env = environment(services["postgres"]), environment(services["temporal"])
    assert temporal_env.get("POSTGRES_SEEDS") == "postgres", "the temporal service does not store its state in the postgres service"
    assert (temporal_env.get("POSTGRES_USER"), temporal_env.get("POSTGRES_PWD")) == (
        pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"]), (
        "the temporal service's POSTGRES_USER/POSTGRES_PWD differ from the postgres service's credentials")
    ui_address = environment(services["temporal-ui"]).get("TEMPORAL_ADDRESS")
    assert ui_address == api_settings.temporal_address, (
        f"temporal-ui talks to {ui_address!r}, Engram to {api_settings.temporal_address!r}")
    assert api_settings.temporal_ui_port in published_ports(services["temporal-ui"]), (
        f"temporal-ui is not published on port {api_settings.temporal_ui_port}, where Settings.temporal_ui_port says it is")


async def test_provider_chain_accepts_the_api_provider_settings(api_settings):
    chain = build_provider_chain(api_settings)  # raises ConfigError if local_only or the allowlist refuses
    try:
        assert [(p.name, p.url) for p in chain] == [("ollama", "http://ollama:11434")], (
            f"the api's provider chain is {[p.name for p in chain]}, not the ollama service alone")
    finally:
        for provider in chain:
            await provider.aclose()


def test_the_qdrant_image_is_a_release_the_server_adapter_accepts(services):
    """QdrantServerIndex refuses a server older than MIN_SERVER at start."""
    tag = services["qdrant"]["image"].rsplit(":", 1)[1]
    assert tuple(int(part) for part in tag.lstrip("v").split(".")[:2]) >= QdrantServerIndex.MIN_SERVER


@pytest.mark.parametrize("name", ENGRAM_SERVICES)
def test_engram_services_wait_for_healthy_servers(services, name):
    depends = services[name].get("depends_on", {})
    assert isinstance(depends, dict), f"{name}'s depends_on is a list: it would not wait for the servers to be healthy"
    for server in SERVERS:
        assert server in depends, f"{name} does not depend on {server}"
        assert depends[server].get("condition") == "service_healthy", (
            f"{name} starts before {server} is healthy (condition {depends[server].get('condition')!r})")


def test_every_awaited_health_has_a_healthcheck(services):
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for server, spec in (depends.items() if isinstance(depends, dict) else []):
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[server], (
                    f"{name} waits for {server} to be healthy, but {server} has no healthcheck, so it never will be")


@pytest.mark.parametrize("name", ENGRAM_SERVICES)
def test_engram_services_run_their_cli_subcommand(services, name):
    assert services[name].get("build") == ".", f"{name} is not built from the repository's Dockerfile"
    assert dockerfile_entrypoint() == ["engram"], f"the Dockerfile's ENTRYPOINT is {dockerfile_entrypoint()}, not engram"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("engram") == "worker.cli:main", f"the engram console script runs {scripts.get('engram')!r}"
    argv = command(services[name])
    assert argv == [name], f"{name} runs `engram {' '.join(argv)}`, not `engram {name}`"
    assert build_parser().parse_args(argv).command == name, f"`engram {name}` is not a subcommand of api.cli"


def test_image_runs_as_a_non_root_user():
    users = [line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("USER ")]
    assert users, "the Dockerfile sets no USER: the processes would run as root"
    assert users[-1] not in ("root", "0"), f"the Dockerfile's last USER is {users[-1]}"


def test_api_publishes_the_http_port_it_listens_on(services, api_settings):
    assert api_settings.http_host == "0.0.0.0", (
        f"the api listens on {api_settings.http_host}, unreachable from outside its container")
    assert api_settings.http_port in container_ports(services["api"]), (
        f"the api listens on {api_settings.http_port} (Settings.http_port) but publishes {services['api'].get('ports')}")


def test_api_publishes_the_grpc_port_it_listens_on(services, api_settings):
    assert api_settings.grpc_host == "0.0.0.0", (
        f"the gRPC API listens on {api_settings.grpc_host}, unreachable from outside its container")
    assert api_settings.grpc_port != api_settings.http_port, "the gRPC and HTTP APIs share a port"
    assert api_settings.grpc_port in container_ports(services["api"]), (
        f"the gRPC API listens on {api_settings.grpc_port} (Settings.grpc_port) but the api publishes "
        f"{services['api'].get('ports')}")
    assert api_settings.grpc_port in published_ports(services["api"]), "the gRPC port is not published"


def test_named_volumes_are_declared_at_top_level(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.get("source") if isinstance(volume, dict) else volume.split(":", 1)[0]
            if isinstance(volume, dict) and volume.get("type", "volume") != "volume":
                continue
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name} mounts the volume {source!r}, which the top-level volumes lack"
