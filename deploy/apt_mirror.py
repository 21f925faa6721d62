"""The Debian archive this machine's apt already uses, for deploy/smoke.sh's debootstrap: the
repository names no mirror host of its own, so the mirror comes from the apt configuration only
and a machine whose configuration names none stops with one line.

    python3 deploy/apt_mirror.py [APT_DIR]      (default /etc/apt; prints the archive's URI)

Read: `sources.list` and `sources.list.d/*.list` (one-line `deb [options] URI suite ...`
entries) and `sources.list.d/*.sources` (deb822 stanzas: `Types`, `URIs`, `Suites`, `Enabled`).
The first enabled `deb` entry with a release suite (not `-security`, `-updates`,
`-backports`, `-proposed-updates`, nor a flat `path/`) is the archive; a URI whose path ends in
`-security` (the security archive) never is. Python's standard library only: it runs on the
machine's python3 before any image exists.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

_NOT_A_RELEASE = ("-security", "-updates", "-backports", "-proposed-updates")


def _one_line_entries(text: str) -> Iterator[tuple[list[str], list[str]]]:
    """(uris, suites) of each `deb` line of a one-line-style file."""
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            yield [words[0]], [words[1]]


def _deb822_entries(text: str) -> Iterator[tuple[list[str], list[str]]]:
    """(uris, suites) of each enabled stanza of type deb of a deb822 `.sources` file."""
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for raw in stanza.splitlines():
            if raw.startswith("#") or not raw.strip():
                continue
            if raw[0] in " \t" and key:  # a continuation line
                fields[key] += " " + raw.strip()
                continue
            key, _, value = raw.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() in ("no", "false", "0"):
            continue
        yield fields.get("uris", "").split(), fields.get("suites", "").split()


def entries(apt_dir: Path) -> Iterator[tuple[list[str], list[str]]]:
    """Every `deb` entry of the apt configuration under `apt_dir`, in apt's reading order."""
    one_line = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if path.is_file():
            yield from _one_line_entries(path.read_text(errors="replace"))
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        if path.is_file():
            yield from _deb822_entries(path.read_text(errors="replace"))


def archive(apt_dir: Path) -> str | None:
    """The URI of the first Debian archive the configuration names, or None."""
    for uris, suites in entries(apt_dir):
        releases = [s for s in suites if not s.endswith(_NOT_A_RELEASE) and "/" not in s]
        for uri in uris:
            if releases and not uri.rstrip("/").endswith("-security"):
                return uri
    return None


def main(argv: list[str]) -> int:
    apt_dir = Path(argv[0] if argv else "/etc/apt")
    found = archive(apt_dir)
    if found is None:
        print(
            f"no Debian archive in the apt configuration under {apt_dir} (sources.list, "
            "sources.list.d/*.list or *.sources): add the machine's mirror there, as apt itself "
            "needs it, then rerun",
            file=sys.stderr,
        )
        return 1
    print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
