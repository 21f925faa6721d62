"""Native worker threads' panic reports, kept off a command's stderr (ADR 0045).

When a write fails under delta-rs (a full disk, a reset connection), a tokio worker still holding
that upload can panic on its way out (`object_store ... buffered.rs: Already shut down`). The
panic is the worker's: the error itself reaches Python and becomes the command's one line, but
Rust's panic hook prints its report (and, with RUST_BACKTRACE set, a backtrace) straight to file
descriptor 2 first, so an operator would read three lines of library noise above the line that
says what to do. A command therefore runs with fd 2 behind a pipe whose reader passes every line
on except such reports; `--debug` (or OML_DEBUG) turns the filter off.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

# "thread 'tokio-rt-worker' (29756) panicked at /path/buffered.rs:369:41:" (Rust >= 1.80 adds
# the thread id; older releases print "thread 'name' panicked at").
# The terminal stderr was before the filter took fd 2 (None: not filtered, or not a terminal).
_terminal: int | None = None

_PANIC = re.compile(rb"^thread '[^']*'( \(\d+\))? panicked at ")
# What follows a report's message: the backtrace, its frames, Rust's notes and blank lines.
_REPORT_TAIL = re.compile(rb"^(stack backtrace:|note: |\s+\d+: |\s+at )")


def _forward(read_fd: int, write_fd: int) -> None:
    with contextlib.suppress(OSError):  # the original fd closed under a lingering child
        _pass_on(read_fd, write_fd)


def _pass_on(read_fd: int, write_fd: int) -> None:
    skipping = 0  # 0: passing; 1: the next line is a report's message; 2: in a report's tail
    blank = False  # a blank line held back: Rust opens a report with one
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        pending = b""
        while chunk := source.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = []
            for line in lines:
                if _PANIC.match(line):
                    skipping, blank = 1, False
                elif skipping == 1:
                    skipping = 2
                elif skipping == 2 and (not line.strip() or _REPORT_TAIL.match(line)):
                    pass
                elif not line.strip() and not blank:
                    skipping, blank = 0, True
                else:
                    skipping = 0
                    if blank:
                        out.append(b"\n")
                        blank = False
                    out.append(line + b"\n")
            if out:
                os.write(write_fd, b"".join(out))
        if blank:
            os.write(write_fd, b"\n")
        if pending and not _PANIC.match(pending):
            os.write(write_fd, pending)


@contextlib.contextmanager
def native_panics_filtered(enabled: bool = True) -> Iterator[None]:
    """Run the body with fd 2 filtered as the module says; on exit every line has been passed on
    and fd 2 is the original again."""
    if not enabled:
        yield
        return
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    global _terminal
    original = os.dup(2)
    if os.isatty(original):
        _terminal = original
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    reader = threading.Thread(
        target=_forward, args=(read_fd, original), name="oml-stderr", daemon=True
    )
    reader.start()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last writer: the reader drains and ends
        # A child process still holding the pipe keeps it open: wait a little, not for ever.
        reader.join(timeout=2.0)
        _terminal = None
        os.close(original)


def terminal_stderr():
    """A text stream on the terminal behind stderr, for what redraws a line (a progress bar):
    the filter passes whole lines only. None when stderr is no terminal."""
    if _terminal is not None:
        return os.fdopen(os.dup(_terminal), "w", buffering=1)
    if sys.stderr.isatty():
        return sys.stderr
    return None
