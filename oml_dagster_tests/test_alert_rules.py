"""The shipped alert rules (deploy/prometheus/oml-lake.rules.yml, ADR 0068): `promtool check
rules` accepts them and `promtool test rules` runs each rule's unit tests; every alert has a
runbook line in deploy/README.md. promtool is Debian's `prometheus` package (scripts/test.sh
installs it when it can)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RULES = DEPLOY / "prometheus" / "oml-lake.rules.yml"
TESTS = DEPLOY / "prometheus" / "oml-lake.rules.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian's `prometheus` package; scripts/test.sh installs "
    "it when run as root with apt-get)",
)


def alerts() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


@needs_promtool
def test_promtool_accepts_the_rules():
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_rule_passes_its_unit_tests():
    done = subprocess.run(
        [PROMTOOL, "test", "rules", TESTS.name],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_and_has_a_runbook_line():
    tested = set(re.findall(r"alertname: (\w+)", TESTS.read_text()))
    readme = (DEPLOY / "README.md").read_text()
    for name in alerts():
        assert name in tested, f"{name} has no promtool test"
        assert re.search(rf"^\| `{name}` \|", readme, re.M), f"{name} has no runbook line"
