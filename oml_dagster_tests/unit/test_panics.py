"""A command's stderr passes through a filter that drops native worker threads' panic reports
(ADR 0045) and nothing else; `--debug` keeps them."""

from __future__ import annotations

import subprocess
import sys

# A report as Rust's panic hook prints it with RUST_BACKTRACE=1, between two lines of ours.
_SCRIPT = r"""
import os, sys
from oml_dagster.cli.panics import native_panics_filtered
with native_panics_filtered(sys.argv[1] == "on"):
    print("before", file=sys.stderr, flush=True)
    print("", file=sys.stderr, flush=True)
    print("kept after a blank line", file=sys.stderr, flush=True)
    os.write(2, b"\nthread 'tokio-rt-worker' (29756) panicked at /x/object_store-0.13.2/src/"
                b"buffered.rs:369:41:\nAlready shut down\nstack backtrace:\n   0: foo\n"
                b"             at /x/y.rs:1:1\nnote: Some details are omitted, run with "
                b"`RUST_BACKTRACE=full` for a verbose backtrace.\n")
    os.write(2, b"thread 'main' panicked at src/lib.rs:1:1:\nboom\nnote: run with "
                b"`RUST_BACKTRACE=1`\n")
    print("oml-lake: disk full: free space", file=sys.stderr, flush=True)
    print("on stdout")
print("after", file=sys.stderr)
"""


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=60
    )


def test_panic_reports_are_dropped_and_every_other_line_kept():
    done = _run("on")
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        "before",
        "",
        "kept after a blank line",
        "oml-lake: disk full: free space",
        "after",
    ]
    assert done.stdout == "on stdout\n"


def test_with_the_filter_off_everything_passes():
    done = _run("off")
    assert "panicked at" in done.stderr and "Already shut down" in done.stderr
    assert done.stderr.splitlines()[-2:] == ["oml-lake: disk full: free space", "after"]
