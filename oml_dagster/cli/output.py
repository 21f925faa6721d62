"""What every `oml-lake` command prints on stdout goes through `out`: flushed line by line (a
file or pipe sees each line as it happens), and a reader that went away (`oml-lake ... | head`)
is `OutputClosed`, not an OSError a drain would take for a network fault and retry."""

from __future__ import annotations


class OutputClosed(Exception):
    """stdout's reader went away: nothing retries it; the command stops quietly (exit 141, as
    for SIGPIPE)."""


def out(*parts: object) -> None:
    try:
        print(*parts, flush=True)
    except BrokenPipeError:
        raise OutputClosed from None
