"""The questions the lake exists to answer (spec: "lineage and metadata analytics", "event
analytics, lag and volume studies"), asked of one tenant's views. Nothing here decrypts: bodies
stay ciphertext, and no question asks for them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from oml_dagster.lake.analytics.sandbox import TenantConnection


def event_volume(tc: TenantConnection) -> list[dict[str, Any]]:
    """Bronze events per UTC day, event_type and provenance (NULL provenance as 'none')."""
    return tc.rows(
        "SELECT event_date, event_type, coalesce(provenance, 'none') AS provenance,"
        " count(*) AS events FROM bronze_events GROUP BY ALL ORDER BY ALL"
    )


def claims_by_state(tc: TenantConnection) -> list[dict[str, Any]]:
    """Silver claims per state, workarea (with its current path and status from gold.areas) and
    provenance."""
    return tc.rows(
        "SELECT c.state, c.workarea_id, a.path AS workarea_path, a.status AS workarea_status,"
        " c.provenance, count(*) AS claims"
        " FROM silver_claims c LEFT JOIN gold_areas a USING (workarea_id)"
        " GROUP BY ALL ORDER BY ALL"
    )


@dataclass
class LineageStats:
    """What gold.lineage says: edges per graph, label and state; the longest derivation chains
    (ratified claim edges labelled derives_from, followed from the derived claim to its
    sources); and per simulation its taint closure (silver rows with that simulation_id or
    carrying it in sim_derived_ids, live ones apart) and the lineage edges it marks."""

    edges: list[dict[str, Any]]
    longest_chain: int
    chains: list[dict[str, Any]]
    tainted: list[dict[str, Any]]


DERIVATION_LABEL = "derives_from"


def lineage_stats(tc: TenantConnection, top: int = 5) -> LineageStats:
    edges = tc.rows(
        "SELECT graph, edge_label, state, count(*) AS edges FROM gold_lineage"
        " GROUP BY ALL ORDER BY ALL"
    )
    links = tc.con.execute(
        "SELECT src_id || ':' || coalesce(src_version, 0), dst_id || ':' || coalesce(dst_version, 0)"
        " FROM gold_lineage WHERE graph = 'claim' AND state = 'ratified' AND edge_label = ?",
        [DERIVATION_LABEL],
    ).fetchall()
    lengths = longest_paths(links)
    chains = [
        {"claim": node, "chain_edges": length}
        for node, length in sorted(lengths.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        if length > 0
    ]
    tainted = tc.rows(
        "WITH sims AS ("
        "  SELECT simulation_id AS sim FROM silver_claims WHERE simulation_id IS NOT NULL"
        "  UNION SELECT unnest(sim_derived_ids) FROM silver_claims"
        "  UNION SELECT simulation_id FROM gold_lineage WHERE simulation_id IS NOT NULL)"
        " SELECT s.sim AS simulation_id,"
        "  (SELECT count(*) FROM silver_claims c WHERE c.simulation_id = s.sim"
        "     OR list_contains(coalesce(c.sim_derived_ids, []), s.sim)) AS closure_rows,"
        "  (SELECT count(*) FROM silver_claims c WHERE (c.simulation_id = s.sim"
        "     OR list_contains(coalesce(c.sim_derived_ids, []), s.sim))"
        "     AND c.state IN ('promoted', 'held')) AS closure_live,"
        "  (SELECT count(*) FROM gold_lineage l WHERE l.simulation_id = s.sim) AS edges,"
        "  (SELECT count(*) FROM gold_lineage l WHERE l.simulation_id = s.sim"
        "     AND l.state = 'ratified') AS edges_ratified"
        " FROM sims s ORDER BY closure_rows DESC, simulation_id"
    )
    return LineageStats(edges, max(lengths.values(), default=0), chains, tainted)


def longest_paths(links: Iterable[tuple[str, str]]) -> dict[str, int]:
    """For every node of a directed graph given as (from, to) links, the number of links on the
    longest path starting there. A cycle (which lineage should never have) is cut where the walk
    meets a node already on its path."""
    out: dict[str, list[str]] = {}
    nodes: set[str] = set()
    for src, dst in links:
        out.setdefault(src, []).append(dst)
        nodes.update((src, dst))
    length: dict[str, int] = {}
    for start in sorted(nodes):
        if start in length:
            continue
        # Iterative post-order walk; `on_path` guards against cycles.
        stack: list[tuple[str, int]] = [(start, 0)]
        on_path = {start}
        while stack:
            node, i = stack[-1]
            targets = out.get(node, [])
            if i < len(targets):
                stack[-1] = (node, i + 1)
                nxt = targets[i]
                if nxt not in length and nxt not in on_path:
                    stack.append((nxt, 0))
                    on_path.add(nxt)
                continue
            length[node] = max(
                (1 + length[t] for t in targets if t in length and t not in on_path - {node}),
                default=0,
            )
            on_path.discard(node)
            stack.pop()
    return length
