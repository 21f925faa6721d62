"""The workload's simulation runs: which are open, the rows and edges each one taints, and what
`simulation.end` does to them, with and without taint closure."""

from __future__ import annotations

from . import acts
from .model import Journal, Row


class Simulations:
    def __init__(self, journal: Journal):
        self.journal = journal
        self.open: list[str] = []
        self._ids: dict[int, str] = {}  # the plan's run number -> simulation_id
        self._rows: dict[str, list[Row]] = {}
        self._derived_rows: dict[str, list[Row]] = {}
        self._edges: dict[str, list[str]] = {}

    def start(self, run: int) -> None:
        sim = self.journal.id()
        self._ids[run] = sim
        self.open.append(sim)

    def finish(self, run: int) -> None:
        """End run `run` if it is open: the first two runs end with closure and without it, the
        later ones at random."""
        sim = self._ids.get(run)
        if sim in self.open:
            closure = run % 2 == 0 if run < 2 else self.journal.rng.random() < 0.5
            self.end(sim, closure)

    def end(self, sim: str, closure: bool) -> None:
        """After closure the run's rows and rows derived from them are demoted; without it the
        run's own rows become undecided (the generator no longer knows their state)."""
        self.open.remove(sim)
        self.journal.emit(acts.simulation_end_act(sim, closure))
        for row in self._rows.pop(sim, []):
            if row.state in ("promoted", "held"):
                if closure:
                    row.state, row.undecided = "demoted", False
                else:
                    row.undecided = True
        for row in self._derived_rows.pop(sim, []):
            if closure and row.may_be_live:
                row.state, row.undecided = "demoted", False
        for edge_id in self._edges.pop(sim, []):
            self.journal.edges[edge_id] = "demoted"

    def track(self, row: Row) -> None:
        """Remember a new row that a run's end may change."""
        if row.claim.simulation_id:
            self._rows.setdefault(row.claim.simulation_id, []).append(row)
        for sim in row.claim.sim_derived_ids or ():
            self._derived_rows.setdefault(sim, []).append(row)

    def track_edge(self, sim: str | None, edge_id: str) -> None:
        """Remember an edge the end of open run `sim` demotes."""
        if sim in self.open:
            self._edges.setdefault(sim, []).append(edge_id)
