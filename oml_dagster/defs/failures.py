"""Faults in Dagster runs (ADR 0045): transient ones are ridden through inside the run with the
writer's own bounded retry (each retry a warning in the run's log), and anything that still
stops the run fails it with the same one line `oml-lake` prints, as the run's failure reason."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from dagster import AssetExecutionContext, Failure, OpExecutionContext

from oml_dagster.lake.faults import Fault, RetryPolicy, describe, retrying
from oml_dagster.lake.write.drain import DrainObserver

T = TypeVar("T")
# What a run's step logs through: an op's context or an asset's.
RunContext = OpExecutionContext | AssetExecutionContext


@contextlib.contextmanager
def failing_clearly() -> Iterator[None]:
    """Turn an error that ends a run into a `Failure` whose description is its one line (cause,
    object, remedy) and whose metadata names the exit class `oml-lake` would use."""
    try:
        yield
    except Failure:
        raise
    except Exception as error:
        line, code = describe(error)
        raise Failure(
            description=line, metadata={"exit_code": code, "error": type(error).__name__}
        ) from error


def warn_retry(context: RunContext) -> Callable[[Fault, int, float], None]:
    def warn(fault: Fault, failures: int, wait: float) -> None:
        context.log.warning(
            f"{fault.line()} -- retrying in {wait:.1f}s (fault {failures} in a row)"
        )

    return warn


class RunDrainObserver(DrainObserver):
    """A run's drain observer: each retry of the drain a warning in the run's log."""

    def __init__(self, context: RunContext):
        self.context = context

    def retrying(self, fault: Fault, failures: int, wait: float) -> None:
        warn_retry(self.context)(fault, failures, wait)


def with_retry(context: RunContext, policy: RetryPolicy, work: Callable[[], T]) -> T:
    """`work()` within `policy`, each retry a warning in the run's log."""
    return retrying(work, policy, on_retry=warn_retry(context))
