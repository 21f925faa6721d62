"""The operators' view: `dagster-webserver` on loopback, opened in headless Chromium, draws the
outbox and the five lake assets with their tenant partitions (and GraphQL agrees).

Set OML_UPDATE_UI_SCREENSHOT=1 to refresh docs/ui-asset-graph.png from this test."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import urllib.request

import pytest
from dagster import DagsterInstance, build_sensor_context

from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.defs.resources import build_resources

from .dagster_support import (
    BIN,
    REPO,
    background,
    dagster_home,
    free_port,
    fresh_database,
    seed_tenant,
    subprocess_env,
    wait_for,
)

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install -y chromium)",
)

NODES = {"outbox": "postgres", "events": "bronze", "claims": "silver"}
NODES |= {"lineage": "gold", "areas": "gold", "curated": "gold", "erasure_evidence": "reconciler"}
# The analytics read the lake tables with DuckDB (their own job: not materialized here).
NODES |= {
    "event_volume": "analytics",
    "lake_lag": "analytics",
    "claims_by_state": "analytics",
    "lineage_stats": "analytics",
}
KIND = {"outbox": "Postgres"} | {n: "DuckDB" for n, g in NODES.items() if g == "analytics"}
# The outbox's downstream lineage holds the whole graph; a large window keeps node details.
GRAPH_PATH = "/assets/postgres/outbox?view=lineage&lineageScope=downstream&lineageDepth=4"
WINDOW = "--window-size=3600,2000"
# The picture: a window the graph fills (Dagster fits it to the view), drawn at twice the pixels.
SHOT_WINDOW = ["--window-size=2100,1200", "--force-device-scale-factor=2"]
SCREENSHOT = REPO / "docs" / "ui-asset-graph.png"


def chromium(args: list[str], profile, timeout: float = 120) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, *args], capture_output=True, timeout=timeout, check=False
    )


def text_of(dom: str) -> list[str]:
    """The page's visible text, one token per element."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    return [html.unescape(t).strip() for t in re.split(r"<[^>]+>", dom) if t.strip()]


def graph_node(tokens: list[str], name: str) -> list[str]:
    """The text of the graph node titled `name`: from its title to its kind tag."""
    for i, token in enumerate(tokens):
        if token == name and "Latest event" in tokens[i + 1 : i + 3]:
            end = next(
                (
                    j
                    for j in range(i, len(tokens))
                    if tokens[j] in ("Delta Lake", "Postgres", "DuckDB")
                ),
                len(tokens) - 1,
            )
            return tokens[i : end + 1]
    raise AssertionError(f"no graph node {name!r} in the page: {tokens[:120]}")


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.load(response)
    assert "errors" not in body, body
    return body["data"]


def serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
            return True
    except OSError:
        return False


def test_the_asset_graph_shows_the_lake_with_tenant_partitions(conn, lake, tmp_path, monkeypatch):
    from oml_dagster.definitions import defs

    tenants = [seed_tenant(conn).tenant_id for _ in range(3)]
    with fresh_database("oml_dagster_ui") as pg:
        home = dagster_home(tmp_path / "dagster_home")
        for name, value in {"DAGSTER_HOME": str(home), **pg}.items():
            monkeypatch.setenv(name, value)
        instance = DagsterInstance.get()
        # One sensor tick, applied as the daemon applies it: partitions and the outbox's events.
        with build_sensor_context(
            instance_ref=instance.get_ref(), definitions=defs, resources=build_resources()
        ) as context:
            tick = defs.get_sensor_def("outbox_sensor").evaluate_tick(context)
        for request in tick.dynamic_partitions_requests:
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        for event in tick.asset_events:
            instance.report_runless_asset_event(event)
        # Two of the three tenants drained (and checked) by in-process runs.
        job = defs.resolve_job_def("lake_writer_job")
        for tenant_id in tenants[:2]:
            assert job.execute_in_process(partition_key=tenant_id, instance=instance).success

        port = free_port()
        env = subprocess_env(DAGSTER_HOME=str(home), **pg)
        web = [
            str(BIN / "dagster-webserver"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-w",
            str(REPO / "workspace.yaml"),
        ]
        with background(web, env, tmp_path / "webserver.log") as proc:
            wait_for(lambda: serving(port) or proc.poll() is not None, 90, what="the webserver")
            assert proc.poll() is None, (tmp_path / "webserver.log").read_text()[-2000:]

            nodes = graphql(
                port,
                "{ assetNodes { assetKey { path } groupName isExecutable"
                " partitionDefinition { name type } partitionKeysByDimension { partitionKeys }"
                " partitionStats { numMaterialized numPartitions } } }",
            )["assetNodes"]
            by_key = {"/".join(n["assetKey"]["path"]): n for n in nodes}
            assert set(by_key) == {f"{group}/{name}" for name, group in NODES.items()}
            for key, node in by_key.items():
                assert node["groupName"] == key.split("/")[0]
                assert node["partitionDefinition"] == {
                    "name": TENANT_PARTITIONS_NAME,
                    "type": "DYNAMIC",
                }
                assert sorted(node["partitionKeysByDimension"][0]["partitionKeys"]) == sorted(
                    tenants
                )
                expected = 3 if key == "postgres/outbox" else 2
                if key.startswith("analytics/"):
                    expected = 0
                assert node["partitionStats"] == {
                    "numMaterialized": expected,
                    "numPartitions": 3,
                }
            assert not by_key["postgres/outbox"]["isExecutable"]

            url = f"http://127.0.0.1:{port}{GRAPH_PATH}"
            dom = chromium(
                [WINDOW, "--virtual-time-budget=20000", "--dump-dom", url], tmp_path / "profile"
            )
            tokens = text_of(dom.stdout.decode(errors="replace"))
            shot = tmp_path / "ui-asset-graph.png"
            chromium(
                [*SHOT_WINDOW, "--virtual-time-budget=20000", f"--screenshot={shot}", url],
                tmp_path / "profile-shot",
            )

    # Every node is drawn under its group, with the tenant partitions.
    for group in set(NODES.values()):
        assert group in tokens, group
    for name in NODES:
        node = graph_node(tokens, name)
        assert "3 partitions" in node, (name, node)
        assert KIND.get(name, "Delta Lake") in node, (name, node)
    assert tokens.count("3 partitions") == len(NODES)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # a drawn graph, not an empty page
    if os.environ.get("OML_UPDATE_UI_SCREENSHOT") == "1":
        shutil.copy(shot, SCREENSHOT)
