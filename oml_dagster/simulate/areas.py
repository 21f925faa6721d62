"""The workload's workarea tree: the root and its areas, their paths, statuses and crews, the
area edges, and validation (which first demotes every tainted row that may still be live)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import acts
from .acts import Edge
from .model import Area, Journal, Row

_AREA_LABELS = ("relates_to", "continues", "derived_from", "mirrors")


class AreaTree:
    def __init__(self, journal: Journal):
        self.journal = journal
        self.rng = journal.rng
        self.areas: dict[str, Area] = {}
        self.area_list: list[Area] = []
        self.labels: set[str] = set()
        self.area_edges: list[str] = []
        self.root: Area | None = None

    def plant(self, areas: int) -> None:
        """The root (committed) and `areas` development areas below it."""
        journal = self.journal
        label = f"u{self.rng.getrandbits(24):06x}"
        self.labels.add(label)
        root = Area(journal.id(), None, label, label, "committed")
        self.areas[root.workarea_id] = root
        self.area_list.append(root)
        self.root = root
        journal.emit(
            acts.upsert_area_act(
                root.workarea_id,
                parent_id=None,
                path=root.path,
                status=root.status,
                crew_name=None,
                created_at=journal.now(),
            )
        )
        for _ in range(areas):
            self.new_area()

    def __getitem__(self, workarea_id: str) -> Area:
        return self.areas[workarea_id]

    def new_area(self) -> None:
        rng, journal = self.rng, self.journal
        parent = rng.choice(self.area_list)
        label = f"a{rng.getrandbits(24):06x}"
        while label in self.labels:
            label = f"a{rng.getrandbits(24):06x}"
        self.labels.add(label)
        area = Area(
            journal.id(), parent.workarea_id, label, f"{parent.path}.{label}", "development"
        )
        self.areas[area.workarea_id] = area
        self.area_list.append(area)
        journal.emit(
            acts.upsert_area_act(
                area.workarea_id,
                parent_id=area.parent_id,
                path=area.path,
                status=area.status,
                **self._crew(),
                created_at=journal.now(),
            )
        )

    def _crew(self) -> dict[str, Any]:
        rng = self.rng
        if rng.random() < 0.3:
            return {"crew_name": None, "crew_charter_uri": None, "crew_external_manager": None}
        crew = f"crew-{rng.randrange(100):02d}"
        return {
            "crew_name": crew,
            "crew_charter_uri": f"https://charters.example/{crew}/v{rng.randrange(1, 9)}",
            "crew_external_manager": rng.choice((None, "jira:OPS", "linear:PLAT", "asana:DATA")),
        }

    def _children(self) -> dict[str, list[Area]]:
        children: dict[str, list[Area]] = {}
        for area in self.areas.values():
            if area.parent_id is not None:
                children.setdefault(area.parent_id, []).append(area)
        return children

    def _subtree(self, area: Area, children: dict[str, list[Area]]) -> list[Area]:
        found, stack = [], list(children.get(area.workarea_id, ()))
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(children.get(node.workarea_id, ()))
        return found

    def reparent(self) -> None:
        rng = self.rng
        nodes = [a for a in self.areas.values() if a is not self.root]
        if not nodes:
            return
        node = rng.choice(nodes)
        children = self._children()
        subtree = self._subtree(node, children)
        barred = {node.workarea_id, node.parent_id} | {a.workarea_id for a in subtree}
        parents = [a for a in self.areas.values() if a.workarea_id not in barred]
        if not parents:
            return
        parent = rng.choice(parents)
        node.parent_id = parent.workarea_id
        node.path = f"{parent.path}.{node.label}"
        self.journal.emit(acts.reparent_area_act(node.workarea_id, parent.workarea_id, node.path))
        for child in subtree:  # parent-first, as the lake rewrites the subtree
            parent_path = self.areas[child.parent_id].path if child.parent_id else ""
            child.path = f"{parent_path}.{child.label}"

    def status_change(self) -> None:
        """An area moves up the ladder, development to committed (it never moves down)."""
        areas = [a for a in self.areas.values() if a.status == "development"]
        if areas:
            area = self.rng.choice(areas)
            area.status = "committed"
            self.journal.emit(acts.upsert_area_act(area.workarea_id, status=area.status))

    def crew_update(self) -> None:
        area = self.rng.choice(self.area_list)
        self.journal.emit(acts.upsert_area_act(area.workarea_id, **self._crew()))

    def area_edge(self) -> None:
        """Ratify an edge between two areas, or now and then demote one."""
        rng, journal = self.rng, self.journal
        if self.area_edges and rng.random() < 0.3:
            edge_id = self.area_edges.pop(rng.randrange(len(self.area_edges)))
            journal.edges[edge_id] = "demoted"
            journal.emit(acts.demote_edge_act(edge_id))
            return
        if len(self.areas) < 2:
            return
        src, dst = rng.sample(self.area_list, 2)
        edge_id, proposer, ratifier = journal.reviewers()
        label = rng.choice(_AREA_LABELS)
        ends = (src.workarea_id, dst.workarea_id)
        # A workarea edge joins areas, not claim versions: no src_version or dst_version.
        edge = Edge(edge_id, *ends, "workarea", label, None, None, proposer, ratifier)
        self.area_edges.append(journal.ratify(edge))

    def open_area(self) -> Area:
        """An area that is not validated (a promotion or a move may land there)."""
        while True:  # the root is never validated, so this ends
            area = self.rng.choice(self.area_list)
            if not area.frozen:
                return area

    def validate(self, demote: Callable[[Row], None]) -> None:
        """Validate an area: first `demote` every tainted row in it that may still be promoted
        or held, move it to committed, then validate."""
        candidates = [a for a in self.areas.values() if a is not self.root and not a.frozen]
        if not candidates:
            return
        area = self.rng.choices(candidates, [1 + len(a.rows) for a in candidates])[0]
        for row in sorted(area.rows, key=lambda r: (r.claim.artifact_id, r.claim.version)):
            if row.tainted and row.may_be_live:
                demote(row)
        if area.status == "development":
            area.status = "committed"
            self.journal.emit(acts.upsert_area_act(area.workarea_id, status="committed"))
        area.status = "validated"
        self.journal.emit(acts.validate_area_act(area.workarea_id))
