"""deploy/docker and deploy/helm, checked as files (deploy/smoke.sh runs the compose stack in
real containers): the files parse, every image is pinned, the image installs exactly what
pyproject.toml declares (at the versions this suite runs with), every environment variable a
service is given is one the code or dagster.yaml reads, the lake's credentials reach only the code
location, the launcher and the runs, the CI override keeps every server on loopback and pulls no
image, the Helm values carry the same run limits as dagster.yaml, and each dagster.yaml loads in
a real Dagster instance on PostgreSQL."""

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
    """What the image must install: the runtime dependencies and the run launchers' extras."""
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in project["dependencies"] + extras["docker"] + extras["k8s"]]


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


def compose_ci() -> dict:
    return yaml.safe_load((DOCKER / "compose.ci.yaml").read_text())


def compose_scale() -> dict:
    return yaml.safe_load((DOCKER / "compose.scale.yaml").read_text())


def container_context(environment: dict, **variables: str) -> dict:
    """The code location's DAGSTER_CONTAINER_CONTEXT as compose hands it over: each
    `${NAME:-default}` replaced by `variables[NAME]`, else its default."""
    text = re.sub(
        r"\$\{([A-Z0-9_]+):-([^}]*)\}",
        lambda m: variables.get(m[1], m[2]),
        environment["DAGSTER_CONTAINER_CONTEXT"],
    )
    return yaml.safe_load(text)


def run_launcher() -> dict:
    return yaml.safe_load((DOCKER / "run_launcher.yaml").read_text())["run_launcher"]


def image_instance_yaml() -> str:
    """The dagster.yaml the image writes into DAGSTER_HOME: the repository's, then the launcher."""
    return (REPO / "dagster.yaml").read_text() + (DOCKER / "run_launcher.yaml").read_text()


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
    names.update(re.findall(r"\{env: ([A-Z0-9_]+)\}", image_instance_yaml()))
    # Dagster's own: the image runs are started from, and what they are given (container context).
    names.update({"DAGSTER_CURRENT_IMAGE", "DAGSTER_CONTAINER_CONTEXT"})
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
    (arg,) = [args for instruction, args in steps if instruction == "ARG"]
    name, _, default = arg.partition("=")
    assert name == "BASE_IMAGE" and _pinned(default) and default.startswith("debian:bookworm")
    (base,) = [args for instruction, args in steps if instruction == "FROM"]
    assert base == "${BASE_IMAGE}"
    runs = " && ".join(args for instruction, args in steps if instruction == "RUN")
    assert "python3 python3-venv" in runs and "python3 -m venv /opt/venv" in runs
    assert "pip install --no-deps -r requirements.txt" in runs
    assert 'pip install --no-deps ".[docker,k8s]"' in runs and "pip check" in runs
    assert "oml-lake --help" in runs, "the CLI is checked inside the image"
    assert "cat run_launcher.yaml >>dagster.yaml" in runs
    for instruction, args in steps:
        if instruction == "COPY":
            *sources, _ = shlex.split(args)
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
                assert _in_build_context(source), f"COPY {source}: .dockerignore leaves it out"
    users = [args for instruction, args in steps if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    env = " ".join(args for instruction, args in steps if instruction == "ENV")
    assert "DAGSTER_HOME=/opt/dagster/dagster_home" in env and "PATH=/opt/venv/bin:" in env
    (cmd,) = [args for instruction, args in steps if instruction == "CMD"]
    assert "oml_dagster.definitions" in cmd and "code-server" in cmd


def _in_build_context(source: str) -> bool:
    """Whether .dockerignore (everything out, then named paths back in) keeps `source`."""
    kept = [
        line[1:].strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    return any(source == k or source.startswith(k.rstrip("/") + "/") for k in kept)


# --- compose -----------------------------------------------------------------------------------


def test_compose_has_every_service_with_pinned_images_health_checks_and_an_init():
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
    # The migrations as the tables' owner, then the writer's login role (ADR 0049), which every
    # other process of the lake connects as.
    assert services["migrate"]["command"] == [
        "oml-lake", "db", "upgrade", "--writer-role", "oml_writer"
    ]  # fmt: skip
    assert services["migrate"]["environment"]["OML_PG_DSN"].startswith("postgresql://oml:")
    for name in ("code", "daemon"):
        dsn = services[name]["environment"]["OML_PG_DSN"]
        assert dsn.startswith("postgresql://oml_writer:${OML_WRITER_PASSWORD:?"), (name, dsn)
    assert (
        services["code"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    )
    # Readiness: every long-running service says when it is ready, and the Dagster processes
    # start after what they need is ready; PID 1 is an init, so `down` does not wait on SIGTERM.
    for name in ("postgres", "minio", *DAGSTER_SERVICES):
        assert services[name]["healthcheck"]["test"], f"{name}: no health check"
    for name in ("webserver", "daemon"):
        assert services[name]["depends_on"]["code"]["condition"] == "service_healthy", name
        assert "/var/run/docker.sock:/var/run/docker.sock" in services[name]["volumes"], name
    for name in ("postgres", "migrate", *DAGSTER_SERVICES):
        assert services[name].get("init") is True, f"{name}: no init as PID 1"
    assert services["code"]["environment"]["DAGSTER_CURRENT_IMAGE"] == built
    # Published ports live apart (host networking refuses them); .env adds them to a plain `up`.
    assert not [n for n, s in services.items() if s.get("ports")]
    published = yaml.safe_load((DOCKER / "compose.ports.yaml").read_text())["services"]
    assert published["webserver"]["ports"] == ["127.0.0.1:3000:3000"]
    dotenv = dict(
        line.split("=", 1)
        for line in (DOCKER / ".env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert dotenv["COMPOSE_FILE"] == "compose.yaml:compose.ports.yaml"


def test_compose_environment_is_what_the_code_reads_and_lake_credentials_stay_off_the_ui():
    services = compose()["services"]
    read = names_the_code_reads()
    storage_names = set(re.findall(r"\{env: ([A-Z0-9_]+)\}", (REPO / "dagster.yaml").read_text()))
    assert storage_names == {f"DAGSTER_PG_{k}" for k in ("HOST", "PORT", "USER", "PASSWORD", "DB")}
    for name in DAGSTER_SERVICES:
        env = services[name]["environment"]
        unknown = {k for k in env if k.startswith(("OML_", "AWS_", "DAGSTER_")) and k not in read}
        assert not unknown, f"{name}: nothing reads {sorted(unknown)}"
        assert storage_names <= set(env), f"{name}: dagster.yaml needs {sorted(storage_names)}"
        # Every Dagster process builds the instance, launcher included.
        assert "OML_RUN_NETWORK" in env, name
    code = services["code"]["environment"]
    assert code["OML_LAKE_URI"].startswith("s3://")
    lake = {"OML_PG_DSN", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert lake <= set(code)
    # The launcher hands each run container the variables it names, from its own environment
    # (an unset one fails the launch): the daemon holds every one of them, the webserver none
    # of the lake's.
    launched = set(run_launcher()["config"]["env_vars"])
    assert lake <= launched and storage_names <= launched
    daemon = services["daemon"]["environment"]
    assert launched <= set(daemon), sorted(launched - set(daemon))
    held = set(services["webserver"]["environment"])
    assert not {k for k in held if k.startswith("AWS_") or k == "OML_PG_DSN"}, held
    assert (
        services["daemon"]["environment"]["OML_RUN_NETWORK"]
        == compose()["networks"]["default"]["name"]
    )
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    (server,) = [entry["grpc_server"] for entry in workspace["load_from"]]
    command = services["code"]["command"]
    assert server["host"] == "code"
    assert command[command.index("--port") + 1] == str(server["port"])
    assert server["location_name"] == pyproject()["tool"]["dagster"]["code_location_name"]


def test_the_ci_override_keeps_every_server_on_loopback_and_pulls_no_image():
    """compose.ci.yaml (deploy/smoke.sh): host networking for every service and run container,
    each server bound to 127.0.0.1, every image built here (a missing one would be pulled)."""
    base, ci = compose()["services"], compose_ci()["services"]
    assert set(ci) == set(base)
    for name in base:
        assert ci[name]["network_mode"] == "host", name
        assert ci[name].get("environment", {}).get("OML_RUN_NETWORK", "host") == "host", name
    built = {
        ci[n].get("image") or base[n]["image"] for n in base if "build" in {**base[n], **ci[n]}
    }
    for name in base:
        image = ci[name].get("image") or base[name]["image"]
        assert image in built, f"{name}: {image} would be pulled"
    commands = {
        name: " ".join(ci[name].get("command", base[name].get("command", []))) for name in ci
    }
    assert "--host 127.0.0.1" in commands["code"] and "--host 127.0.0.1" in commands["webserver"]
    assert "-H 127.0.0.1" in commands["minio"]
    assert ci["postgres"]["environment"]["PGHOST"] == "127.0.0.1"
    ci_workspace = yaml.safe_load((DOCKER / "ci" / "workspace.yaml").read_text())
    (server,) = [entry["grpc_server"] for entry in ci_workspace["load_from"]]
    code = ci["code"]["command"]
    assert server["host"] == "127.0.0.1" and code[code.index("--port") + 1] == str(server["port"])
    for name in ("webserver", "daemon"):
        assert "./ci/workspace.yaml:/opt/dagster/app/workspace.yaml:ro" in ci[name]["volumes"]
    # A setting a run reads reaches the run containers through the code location's context.
    context = container_context(ci["code"]["environment"])
    assert (
        "OML_SHARD_RUN_SECONDS=" + ci["code"]["environment"]["OML_SHARD_RUN_SECONDS"]
        in (context["docker"]["env_vars"])
    )


def test_every_run_container_gets_the_cpu_quota_the_operator_sets():
    """OML_RUN_NANO_CPUS reaches the DockerRunLauncher as `nano_cpus` of the code location's
    container context (merged into every run container's settings; ADR 0069), unset or 0 no
    quota, in the stack and under the CI override; the scaling bench's override sets the shard
    count and the quota from its own variables, for the code location and its runs alike."""
    for environment in (compose()["services"]["code"]["environment"],
                        compose_ci()["services"]["code"]["environment"]):  # fmt: skip
        assert container_context(environment)["docker"]["container_kwargs"] == {"nano_cpus": 0}
        quota = container_context(environment, OML_RUN_NANO_CPUS="250000000")
        assert quota["docker"]["container_kwargs"] == {"nano_cpus": 250_000_000}
    # The launcher's own container settings stay (the context's are merged over them, key by
    # key): the quota is not one of them.
    assert "nano_cpus" not in run_launcher()["config"]["container_kwargs"]
    scale = compose_scale()["services"]["code"]["environment"]
    context = container_context(scale, OML_SCALE_SHARDS="2", OML_RUN_NANO_CPUS="500000000")
    assert context["docker"]["container_kwargs"] == {"nano_cpus": 500_000_000}
    assert "OML_DRAIN_SHARDS=2" in context["docker"]["env_vars"]
    assert scale["OML_DRAIN_SHARDS"] == "${OML_SCALE_SHARDS:-4}"
    assert (
        "OML_SHARD_RUN_SECONDS=${OML_SCALE_RUN_SECONDS:-1800}" in scale["DAGSTER_CONTAINER_CONTEXT"]
    )
    assert scale["OML_SHARD_RUN_SECONDS"] == "${OML_SCALE_RUN_SECONDS:-1800}"


def test_the_exporter_and_prometheus_run_in_the_stack_on_loopback_in_ci():
    """The exporter (`oml-lake exporter`, the writer's role) and Prometheus (Debian's package,
    built here, the lake's rules loaded) are services of the stack; under the CI override both
    listen on 127.0.0.1 and Prometheus scrapes the port the exporter listens on."""
    base, ci = compose()["services"], compose_ci()["services"]
    exporter, prometheus = base["exporter"], base["prometheus"]
    assert exporter["image"] == base["migrate"]["image"]
    assert exporter["command"][:2] == ["oml-lake", "exporter"]
    assert exporter["environment"]["OML_PG_DSN"].startswith("postgresql://oml_writer:")
    assert exporter["healthcheck"]["test"] and exporter["init"] is True
    assert prometheus["build"]["dockerfile"] == "deploy/docker/prometheus.Dockerfile"
    dockerfile = (DOCKER / "prometheus.Dockerfile").read_text()
    assert "apt-get install -y --no-install-recommends prometheus" in dockerfile
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for path in source.split():
            assert (REPO / path).exists() and _in_build_context(path), path
    listen = ci["exporter"]["command"][ci["exporter"]["command"].index("--listen") + 1]
    assert listen.startswith("127.0.0.1:")
    assert any(a.startswith("--web.listen-address=127.0.0.1:") for a in ci["prometheus"]["command"])
    ci_config = yaml.safe_load((DOCKER / "ci" / "prometheus.yml").read_text())
    (job,) = ci_config["scrape_configs"]
    assert job["job_name"] == "oml-lake-exporter"
    assert job["static_configs"][0]["targets"] == [listen]
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [
        "exporter:" + exporter["command"][-1].rsplit(":", 1)[1]
    ]
    assert config["rule_files"] == ["/etc/oml-prometheus/oml-lake.rules.yml"]


# --- Helm --------------------------------------------------------------------------------------


def test_the_helm_exporter_runs_the_code_locations_image_settings_and_secrets():
    """deploy/helm/exporter.yaml: the exporter as a Deployment of the user deployment's image,
    env and secrets, and a Service with scrape annotations on the port it listens on; the
    ServiceMonitor (the Prometheus Operator's) selects that Service; compose runs the same."""
    documents = list(yaml.safe_load_all((REPO / "deploy" / "helm" / "exporter.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    service = next(d for d in documents if d["kind"] == "Service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (user,) = helm()["dagster-user-deployments"]["deployments"]
    image = user["image"]
    assert container["image"] == f"{image['repository']}:{image['tag']}"
    assert container["command"] == compose()["services"]["exporter"]["command"]
    port = int(container["command"][-1].rsplit(":", 1)[1])
    assert container["ports"][0]["containerPort"] == port
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    user_env = {e["name"]: e.get("value") for e in user["env"]}
    for e in container["env"]:
        assert e["name"] in names_the_code_reads(), e
        if e["name"] in user_env:
            assert e["value"] == user_env[e["name"]], e
    assert [s["secretRef"]["name"] for s in container["envFrom"]] == [
        s["name"] for s in user["envSecrets"]
    ]
    monitor = yaml.safe_load(
        (REPO / "deploy" / "helm" / "exporter-servicemonitor.yaml").read_text()
    )
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


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


def test_helm_and_compose_run_the_same_code_location():
    """The Helm values keep in step with the compose topology: the same image tag, the same
    settings for the code location (and so for its runs), the same tick retention."""
    values = helm()
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    code = compose()["services"]["code"]
    assert code["image"] == f"oml-lake:{deployment['image']['tag']}"
    helm_env = {e["name"]: e.get("value") for e in deployment["env"]}
    settings_set = {k: v for k, v in code["environment"].items() if k.startswith("OML_")}
    for name in ("OML_DAGSTER_AUTOSTART", "OML_SENSOR_INTERVAL_SECONDS", "OML_DRAIN_SHARDS"):
        assert helm_env[name] == settings_set[name], name
    assert helm_env["OML_MAX_BATCH"] == settings_set["OML_MAX_BATCH"]
    # What compose hands its run containers through the container context is what it sets on
    # the code location (Helm's includeConfigInLaunchedRuns copies the whole env).
    context = container_context(code["environment"])
    for pair in context["docker"]["env_vars"]:
        name, _, value = pair.partition("=")
        assert settings_set[name] == value, pair
    instance = yaml.safe_load((REPO / "dagster.yaml").read_text())["retention"]
    chart = values["retention"]
    assert chart["enabled"] is True
    assert chart["sensor"]["purgeAfterDays"] == instance["sensor"]["purge_after_days"]
    assert chart["schedule"]["purgeAfterDays"] == instance["schedule"]["purge_after_days"]


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


@pytest.mark.parametrize("variant", ["repository", "image", "helm"])
def test_each_dagster_yaml_loads_with_the_cap_and_the_lease(variant, dsn, tmp_path, monkeypatch):
    """The repository's dagster.yaml (the demo's), the one the image writes into DAGSTER_HOME
    (the repository's plus the DockerRunLauncher; the compose services give it DAGSTER_PG_* and
    OML_RUN_NETWORK), and the chart's run-coordinator settings from the Helm values
    (`helm_instance_yaml`), each loaded in a Dagster instance on a real PostgreSQL database:
    the same global cap, per-tenant lease and tick retention read back from each."""
    import psycopg
    from dagster import DagsterInstance
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import PostgresRunStorage

    copied = [a for i, a in dockerfile() if i == "COPY" and "dagster.yaml" in a]
    assert copied == ["dagster.yaml deploy/docker/run_launcher.yaml /opt/dagster/dagster_home/"]
    monkeypatch.setenv("OML_RUN_NETWORK", "host")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    monkeypatch.setenv("DAGSTER_PG_HOST", info.get("host", "127.0.0.1"))
    monkeypatch.setenv("DAGSTER_PG_PORT", str(info.get("port", 5432)))
    monkeypatch.setenv("DAGSTER_PG_USER", info["user"])
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", info.get("password", ""))
    monkeypatch.setenv("DAGSTER_PG_DB", info["dbname"])
    home = tmp_path / "dagster_home"
    home.mkdir()
    if variant == "repository":
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    elif variant == "image":
        (home / "dagster.yaml").write_text(image_instance_yaml())
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
        if variant == "image":
            from dagster_docker import DockerRunLauncher

            launcher = instance.run_launcher
            assert isinstance(launcher, DockerRunLauncher)
            assert launcher.networks == ["host"]
            assert launcher.container_kwargs == {
                "init": True,
                "auto_remove": True,
                "mem_limit": "5g",
                "memswap_limit": "5g",
            }
        if variant != "helm":
            # Ticks do not pile up forever: skipped sensor ticks go after a day.
            from dagster._core.definitions.run_request import InstigatorType
            from dagster._core.scheduler.instigation import TickStatus

            sensor = instance.get_tick_retention_settings(InstigatorType.SENSOR)
            assert sensor[TickStatus.SKIPPED] == 1 and sensor[TickStatus.SUCCESS] == 14
            assert (
                instance.get_tick_retention_settings(InstigatorType.SCHEDULE)[TickStatus.SUCCESS]
                == 90
            )


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
                assert "${POSTGRES_PASSWORD:?" in value or "${OML_WRITER_PASSWORD:?" in value, (
                    name,
                    value,
                )

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


def test_the_workspace_validates(tmp_path):
    """`dagster definitions validate` of the repository's workspace (deploy/smoke.sh validates the
    deployed one, over gRPC, inside the webserver's container)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    env["DAGSTER_HOME"] = str(tmp_path)
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate"]
        + ["-w", str(REPO / "workspace.yaml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "All code locations passed validation" in done.stderr + done.stdout


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
