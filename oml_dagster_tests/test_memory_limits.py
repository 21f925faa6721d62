"""The run containers' memory limits (compose's DockerRunLauncher, the Helm chart's run pods)
hold the heaviest pinned peak of bench/memory_peaks.json plus its tolerance, so an operation the
benchmark accepts is never killed by its own container's limit; and the pins are what the
benchmark checks against."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PINS = json.loads((REPO / "bench" / "memory_peaks.json").read_text())
MIB = 1024 * 1024
_UNITS = {"k": 1024, "m": MIB, "g": 1024 * MIB, "ki": 1024, "mi": MIB, "gi": 1024 * MIB}


def _bytes(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([kKmMgG]i?)?", str(value)).groups()
    return int(number) * _UNITS.get((unit or "").lower(), 1)


def _heaviest() -> float:
    return max(PINS["peaks_mib"].values()) * (1 + PINS["tolerance"]) * MIB


def test_every_operation_the_benchmark_measures_is_pinned():
    assert set(PINS["peaks_mib"]) == {
        "drain_1m",
        "compact_1m",
        "zorder_5m",
        "demote_5m",
        "erase_5m",
    }
    assert 0 < PINS["tolerance"] <= 0.25


def test_compose_run_containers_hold_the_heaviest_peak():
    launcher = yaml.safe_load((REPO / "deploy" / "docker" / "run_launcher.yaml").read_text())
    kwargs = launcher["run_launcher"]["config"]["container_kwargs"]
    limit = _bytes(kwargs["mem_limit"])
    assert _heaviest() <= limit <= 2 * _heaviest()
    assert _bytes(kwargs["memswap_limit"]) == limit  # no swap past the limit


def test_helm_run_pods_hold_the_heaviest_peak():
    values = yaml.safe_load((REPO / "deploy" / "helm" / "values.yaml").read_text())
    resources = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"][
        "containerConfig"
    ]["resources"]
    limit = _bytes(resources["limits"]["memory"])
    assert _heaviest() <= limit <= 2 * _heaviest()
    assert _bytes(resources["requests"]["memory"]) <= limit
