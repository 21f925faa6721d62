"""A small demo workload through the producer's acts, for machines without `oml-lake simulate`.

    python deploy/seed_demo.py --tenants 3 --claims 20          # write and exit
    python deploy/seed_demo.py --stream 600 --rate 2            # keep acting, a new tenant now
                                                                #  and then, for 600 s

Every act is what the OML service commits: domain rows, a signed hash-chained journal event and
its outbox ops (OML_PG_DSN names the database; `oml-lake db upgrade` first)."""

from __future__ import annotations

import argparse
import random
import time
import uuid

from oml_dagster.lake import db
from oml_dagster.simulate import acts, producer


class DemoTenant:
    def __init__(self, conn, rng: random.Random):
        self.conn, self.rng = conn, rng
        self.keys = producer.create_tenant(conn)
        self.root, self.team, self.lab = (str(uuid.uuid4()) for _ in range(3))
        acts.upsert_area(conn, self.keys, self.root, path="org", status="development")
        for area, path in ((self.team, "org.team"), (self.lab, "org.lab")):
            acts.upsert_area(
                conn, self.keys, area, parent_id=self.root, path=path, status="development"
            )
        self.live: list[acts.Claim] = []
        self.validated = False

    def act(self) -> None:
        """One act, chosen like a busy tenant would: mostly promotions, then edges, retracts, a
        validation, and now and then a self-signed promotion the writer dead-letters."""
        roll = self.rng.random()
        if roll < 0.55 or len(self.live) < 3:
            areas = [(self.lab, "org.lab")] + ([] if self.validated else [(self.team, "org.team")])
            area, path = self.rng.choice(areas)
            claim = acts.Claim(str(uuid.uuid4()), 1, area, path)
            forged = self.rng.random() < 0.03
            acts.promote(
                self.conn,
                self.keys,
                claim,
                f"claim {claim.artifact_id}".encode(),
                self_signed=forged,
            )
            if not forged:
                self.live.append(claim)
        elif roll < 0.75:
            src, dst = self.rng.sample(self.live, 2)
            edge = acts.Edge(str(uuid.uuid4()), src.artifact_id, dst.artifact_id)
            acts.ratify(self.conn, self.keys, edge)
        elif roll < 0.87:
            acts.demote(self.conn, self.keys, self._retire())
        elif roll < 0.95:
            acts.erase(self.conn, self.keys, self._retire())
        elif not self.validated:
            acts.upsert_area(self.conn, self.keys, self.team, status="committed")
            acts.validate_area(self.conn, self.keys, self.team)
            self.validated = True
        else:
            acts.upsert_area(
                self.conn, self.keys, self.lab, crew_name=f"crew {self.rng.randrange(9)}"
            )

    def _retire(self) -> acts.Claim:
        return self.live.pop(self.rng.randrange(len(self.live)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--claims", type=int, default=20, help="acts per tenant when seeding")
    parser.add_argument("--stream", type=float, default=0, help="seconds to keep acting")
    parser.add_argument("--rate", type=float, default=2.0, help="acts per second when streaming")
    parser.add_argument("--new-tenant-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with db.connect(autocommit=True) as conn:
        producer.ensure_schema(conn)
        tenants = [DemoTenant(conn, rng) for _ in range(args.tenants)]
        if not args.stream:
            for tenant in tenants:
                for _ in range(args.claims):
                    tenant.act()
            print(f"seeded {len(tenants)} tenants, {args.claims} acts each", flush=True)
            return
        started = last_new = time.monotonic()
        while time.monotonic() - started < args.stream:
            if time.monotonic() - last_new >= args.new_tenant_every:
                tenants.append(DemoTenant(conn, rng))
                last_new = time.monotonic()
            rng.choice(tenants).act()
            time.sleep(1.0 / args.rate)


if __name__ == "__main__":
    main()
