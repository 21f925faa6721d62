"""deploy/docker and deploy/helm, checked as far as a machine without Docker or Kubernetes can:
the files parse, every image is pinned, the image installs exactly what pyproject.toml declares
(at the versions this suite runs with), every environment variable a service is given is one the
code or dagster.yaml reads, the lake's credentials reach only the code location and its runs,
the Helm values carry the same run limits as dagster.yaml, and dagster.yaml loads in a real
Dagster instance on PostgreSQL."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from oml_dagster import settings

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "deploy" / "docker"
HELM_VALUES = REPO / "deploy" / "helm" / "values.yaml"
DAGSTER_SERVICES = ("code", "webserver", "daemon")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def declared_requirements() -> list[Requirement]:
    """What the image must install: the runtime dependencies and the k8s extra."""
    project = pyproject()["project"]
    return [
        Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["k8s"]
    ]


def pins() -> dict[str, str]:
    found = {}
    for line in (DOCKER / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line)
        assert match, f"requirements.txt: {line!r} is not an exact pin"
        found[canonicalize_name(match[1])] = match[2]
    return found


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, args = line.partition(" ")
            steps.append((instruction.upper(), args.strip()))
    return steps


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def helm() -> dict:
    return yaml.safe_load(HELM_VALUES.read_text())


def names_the_code_reads() -> set[str]:
    """Environment variables read anywhere in the package: every setting (and its earlier names),
    the lake's storage options, other reads of the environment, and dagster.yaml
    (`{env: NAME}`)."""
    names = set(settings.AWS_PASSTHROUGH)
    names.update(n for s in settings.SETTINGS for n in (s.name, *s.aliases))
    pattern = re.compile(
        r"""(?:environ(?:\.get)?|env\.get|getenv)[\[(]\s*["']([A-Z][A-Z0-9_]+)["']"""
    )
    for path in (REPO / "oml_dagster").rglob("*.py"):
        names.update(pattern.findall(path.read_text()))
    names.update(re.findall(r"\{env: ([A-Z0-9_]+)\}", (REPO / "dagster.yaml").read_text()))
    return names


def _pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag != "latest" and bool(re.search(r"\d", tag))


# --- the image ---------------------------------------------------------------------------------


def test_the_pins_satisfy_every_declared_dependency_at_the_tested_versions():
    pinned = pins()
    for requirement in declared_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"requirements.txt does not pin {requirement.name}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{name}=={pinned[name]} does not satisfy pyproject.toml's {requirement}"
        )
        for extra in requirement.extras:  # psycopg[binary] -> psycopg-binary
            assert canonicalize_name(f"{name}-{extra}") in pinned, f"{requirement}: extra {extra}"
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            continue  # dagster-k8s: in the image only
        assert pinned[name] == installed, (
            f"the image pins {name}=={pinned[name]}, the tests run with {installed}"
        )


def test_the_dockerfile_installs_the_pins_and_the_project_and_runs_as_a_user():
    steps = dockerfile()
    (base,) = [args for instruction, args in steps if instruction == "FROM"]
    assert _pinned(base) and base.startswith("python:3.11"), base
    runs = " && ".join(args for instruction, args in steps if instruction == "RUN")
    assert "pip install --no-deps -r requirements.txt" in runs
    assert 'pip install --no-deps ".[k8s]"' in runs and "pip check" in runs
    assert "oml-lake --help" in runs, "the CLI is checked inside the image"
    for instruction, args in steps:
        if instruction == "COPY":
            *sources, _ = shlex.split(args)
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    users = [args for instruction, args in steps if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    env = " ".join(args for instruction, args in steps if instruction == "ENV")
    assert "DAGSTER_HOME=/opt/dagster/dagster_home" in env
    (cmd,) = [args for instruction, args in steps if instruction == "CMD"]
    assert "oml_dagster.definitions" in cmd and "code-server" in cmd


# --- compose -----------------------------------------------------------------------------------


def test_compose_has_every_service_with_pinned_images():
    services = compose()["services"]
    assert set(services) >= {"postgres", "minio", "minio-init", "migrate", *DAGSTER_SERVICES}
    for name, service in services.items():
        assert _pinned(service["image"]), f"{name}: image {service['image']!r} is not pinned"
    assert services["migrate"]["build"]["dockerfile"] == "deploy/docker/Dockerfile"
    assert (REPO / "deploy" / "docker" / services["migrate"]["build"]["context"]).resolve() == REPO
    built = services["migrate"]["image"]
    assert all(services[s]["image"] == built for s in DAGSTER_SERVICES)
    # MinIO honours If-None-Match on PUT from its 2024-08 releases on; the pin is later.
    release = re.fullmatch(
        r"minio/minio:RELEASE\.(\d{4}-\d{2}-\d{2})T[\d-]+Z", services["minio"]["image"]
    )
    assert release and release[1] >= "2024-08-29", services["minio"]["image"]
    assert services["migrate"]["command"] == ["oml-lake", "db", "upgrade"]
    assert (
        services["code"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    )


def test_compose_environment_is_what_the_code_reads_and_lake_credentials_stay_with_the_code():
    services = compose()["services"]
    read = names_the_code_reads()
    storage_names = set(re.findall(r"\{env: ([A-Z0-9_]+)\}", (REPO / "dagster.yaml").read_text()))
    assert storage_names == {f"DAGSTER_PG_{k}" for k in ("HOST", "PORT", "USER", "PASSWORD", "DB")}
    for name in DAGSTER_SERVICES:
        env = services[name]["environment"]
        unknown = {
            k for k in env if k.startswith(("OML_", "AWS_", "DAGSTER_PG_")) and k not in read
        }
        assert not unknown, f"{name}: nothing reads {sorted(unknown)}"
        assert storage_names <= set(env), f"{name}: dagster.yaml needs {sorted(storage_names)}"
    code = services["code"]["environment"]
    assert code["OML_LAKE_URI"].startswith("s3://")
    assert {"OML_PG_DSN", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(
        code
    )
    for name in ("webserver", "daemon"):
        held = set(services[name]["environment"])
        assert not {k for k in held if k.startswith("AWS_") or k.startswith("OML_")}, name
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    (server,) = [entry["grpc_server"] for entry in workspace["load_from"]]
    command = services["code"]["command"]
    assert server["host"] == "code"
    assert command[command.index("--port") + 1] == str(server["port"])
    assert server["location_name"] == pyproject()["tool"]["dagster"]["code_location_name"]


# --- Helm --------------------------------------------------------------------------------------


def test_helm_values_launch_one_pod_per_run_from_the_code_location_image():
    values = helm()
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    image = deployment["image"]
    assert image["tag"] not in ("", "latest") and re.search(r"\d", image["tag"])
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == pyproject()["tool"]["dagster"]["module_name"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    assert deployment["podSecurityContext"]["runAsNonRoot"] is True
    assert values["postgresql"]["enabled"] is False
    assert values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"
    assert values["global"]["postgresqlSecretName"]


def test_helm_env_is_what_the_code_reads_and_secrets_stay_with_the_code_location():
    values = helm()
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    read = names_the_code_reads()
    env = {e["name"]: e.get("value") for e in deployment["env"]}
    assert set(env) <= read, sorted(set(env) - read)
    assert env["OML_LAKE_URI"].startswith("s3://")
    secrets = {s["name"] for s in deployment["envSecrets"]}
    assert {"oml-lake-postgres", "oml-lake-store"} <= secrets
    # The webserver and the daemon never get the lake's secrets, and the launcher adds none to
    # run pods: those inherit them from the code location (includeConfigInLaunchedRuns).
    for component in ("dagsterWebserver", "dagsterDaemon"):
        held = {s.get("name") for s in values[component].get("envSecrets", [])}
        assert not held & secrets, component
    assert not values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"]


def test_helm_resources_are_requested_for_every_pod():
    values = helm()
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    run = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["containerConfig"]
    for where, resources in {
        "run pod": run["resources"],
        "code location": deployment["resources"],
        "webserver": values["dagsterWebserver"]["resources"],
        "daemon": values["dagsterDaemon"]["resources"],
    }.items():
        assert resources["requests"]["cpu"] and resources["requests"]["memory"], where
        assert resources["limits"]["memory"], where
    # A drain is one Python core and peaked at 461 MiB (bench/RESULTS.md): a run pod gets both.
    assert run["resources"]["requests"]["cpu"] == "1"
    assert _mebibytes(run["resources"]["requests"]["memory"]) >= 461


def _mebibytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()
    return int(number) * (1024 if unit == "Gi" else 1)


def helm_instance_yaml() -> dict:
    """The run-coordinator, monitoring and retry part of the dagster.yaml the chart renders from
    these values, by the key mapping of the chart's instance templates (camelCase value ->
    snake_case instance key), on the repository's storage. Not a `helm template` render."""
    values = helm()
    daemon = values["dagsterDaemon"]
    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    monitoring = daemon["runMonitoring"]
    instance = yaml.safe_load((REPO / "dagster.yaml").read_text())
    return {
        "storage": instance["storage"],
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": daemon["runCoordinator"]["type"],
            "config": {
                "max_concurrent_runs": queued["maxConcurrentRuns"],
                "tag_concurrency_limits": queued["tagConcurrencyLimits"],
                "dequeue_interval_seconds": queued["dequeueIntervalSeconds"],
                "dequeue_use_threads": queued["dequeueUseThreads"],
                "dequeue_num_workers": queued["dequeueNumWorkers"],
            },
        },
        "run_monitoring": {
            "enabled": monitoring["enabled"],
            "start_timeout_seconds": monitoring["startTimeoutSeconds"],
            "cancel_timeout_seconds": monitoring["cancelTimeoutSeconds"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
            "free_slots_after_run_end_seconds": monitoring["freeSlotsAfterRunEndSeconds"],
        },
        "run_retries": {
            "enabled": daemon["runRetries"]["enabled"],
            "max_retries": daemon["runRetries"]["maxRetries"],
        },
        "telemetry": {"enabled": values["telemetry"]["enabled"]},
    }


def test_helm_run_limits_sit_where_the_chart_reads_them_and_nowhere_else():
    values = helm()
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["enabled"] and coordinator["type"] == "QueuedRunCoordinator"
    # The chart fails when the same limits are also under `concurrency.runs`.
    runs = values.get("concurrency", {}).get("runs", {})
    assert "maxConcurrentRuns" not in runs and not runs.get("tagConcurrencyLimits")


# --- dagster.yaml ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["image", "helm"])
def test_each_dagster_yaml_loads_with_the_cap_and_the_lease(variant, dsn, tmp_path, monkeypatch):
    """The dagster.yaml the image copies into DAGSTER_HOME (the repository's own; the compose
    services give it DAGSTER_PG_*), and the chart's run-coordinator settings from the Helm values
    (`helm_instance_yaml`), each loaded in a Dagster instance on a real PostgreSQL database:
    the same global cap and per-tenant lease read back from both."""
    import psycopg
    from dagster import DagsterInstance
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import PostgresRunStorage

    copied = [a for i, a in dockerfile() if i == "COPY" and a.endswith("dagster.yaml")]
    assert copied == ["dagster.yaml /opt/dagster/dagster_home/dagster.yaml"]
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    monkeypatch.setenv("DAGSTER_PG_HOST", info.get("host", "127.0.0.1"))
    monkeypatch.setenv("DAGSTER_PG_PORT", str(info.get("port", 5432)))
    monkeypatch.setenv("DAGSTER_PG_USER", info["user"])
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", info.get("password", ""))
    monkeypatch.setenv("DAGSTER_PG_DB", info["dbname"])
    home = tmp_path / "dagster_home"
    home.mkdir()
    if variant == "image":
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    else:
        (home / "dagster.yaml").write_text(yaml.safe_dump(helm_instance_yaml()))
    with DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        limits = instance.get_concurrency_config().run_queue_config
        root = yaml.safe_load((REPO / "dagster.yaml").read_text())["concurrency"]["runs"]
        assert limits.max_concurrent_runs == root["max_concurrent_runs"]
        # The lease: one run per tenant, and one per shard of tenants (ADR 0027).
        assert limits.tag_concurrency_limits == [
            {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
            {"key": "oml/shard", "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
        ]
        assert instance.get_runs() == []  # the storage answers


def _secret_like(key: str) -> bool:
    return bool(re.search(r"(?i)password|secret", key))


def test_deploy_files_hold_no_credentials():
    """Passwords and keys come from the operator's environment (compose) or Kubernetes secrets
    (Helm), never from the files."""
    for name, service in compose()["services"].items():
        for key, value in service.get("environment", {}).items():
            if _secret_like(key):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", str(value)), (name, key, value)
            if key == "OML_PG_DSN":
                assert "${POSTGRES_PASSWORD:?" in value, (name, value)

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if _secret_like(key) and not key.endswith(("SecretName", "Secret")):
                    assert not isinstance(value, str | int), f"{where}.{key} holds a value"
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(helm(), "values")
    (deployment,) = helm()["dagster-user-deployments"]["deployments"]
    assert not [e for e in deployment["env"] if e["name"].startswith("AWS_") and "KEY" in e["name"]]


# --- the compose commands, run here without containers -----------------------------------------


@pytest.mark.slow
def test_the_compose_code_server_serves_the_location_the_workspace_names(tmp_path):
    """The `code` service's own command (on a free loopback port instead of 0.0.0.0:4000) serves
    the code location; the chart's health check answers; and the workspace the webserver and the
    daemon load, pointed at it, lists the location's jobs."""
    import os
    import subprocess
    import time

    from oml_dagster_tests.dagster_support import free_port

    bin_dir = Path(sys.executable).parent
    port = free_port()
    command = list(compose()["services"]["code"]["command"])
    command[command.index("--port") + 1] = str(port)
    command[command.index("--host") + 1] = "127.0.0.1"
    command[0] = str(bin_dir / command[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    server = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        health = [str(bin_dir / "dagster"), "api", "grpc-health-check", "-p", str(port)]
        deadline = time.monotonic() + 90
        while subprocess.run(health, env=env, capture_output=True).returncode != 0:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the code server did not become healthy"
            time.sleep(0.5)
        workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
        workspace["load_from"][0]["grpc_server"].update(host="127.0.0.1", port=port)
        (tmp_path / "workspace.yaml").write_text(yaml.safe_dump(workspace))
        listed = subprocess.run(
            [str(bin_dir / "dagster"), "job", "list", "-w", str(tmp_path / "workspace.yaml")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode == 0, listed.stderr[-2000:]
        assert "Job: lake_writer_job" in listed.stdout, listed.stdout
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(15)
