"""deploy/smoke.sh's Debian mirror comes from the machine's apt configuration only
(deploy/apt_mirror.py): one-line and deb822 sources, the security archive and disabled stanzas
skipped, and one clear line when the configuration names no archive. The repository names no
mirror host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PICKER = REPO / "deploy" / "apt_mirror.py"


def _pick(apt_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PICKER), str(apt_dir)], capture_output=True, text=True, timeout=30
    )


def _apt(tmp_path: Path, *, one_line: str | None = None, **sources: str) -> Path:
    (tmp_path / "sources.list.d").mkdir(parents=True)
    if one_line is not None:
        (tmp_path / "sources.list").write_text(one_line)
    for name, text in sources.items():
        (tmp_path / "sources.list.d" / name.replace("_", ".")).write_text(text)
    return tmp_path


DEB822 = """\
Types: deb
# a comment inside the stanza
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb-src deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
"""


@pytest.mark.parametrize(
    ("config", "archive"),
    [
        ({"debian_sources": DEB822}, "http://mirror.example/debian"),
        (
            {
                "one_line": "# deb http://old.example/debian bookworm main\n"
                "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main\n"
            },
            "http://one.example/debian",
        ),
        (
            {
                "one_line": "deb http://one.example/debian-security bookworm-security main\n"
                "deb-src http://src.example/debian bookworm main\n",
                "extra_list": "deb http://list.example/debian trixie main contrib\n",
            },
            "http://list.example/debian",
        ),
        (
            {
                "a_sources": "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\n"
                "Enabled: no\n",
                "b_sources": "Types: deb\nURIs:\n http://cont.example/debian\nSuites: stable\n",
            },
            "http://cont.example/debian",
        ),
    ],
)
def test_the_archive_is_the_first_release_entry_apt_names(tmp_path, config, archive):
    done = _pick(_apt(tmp_path, **config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == archive


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"debian_sources": DEB822.split("\n\n")[0]},  # the security archive alone
        {"one_line": "deb-src http://src.example/debian bookworm main\n"},
        {
            "off_sources": "Types: deb\nURIs: http://x.example/debian\nSuites: bookworm\nEnabled: no\n"
        },
    ],
)
def test_no_archive_in_the_configuration_stops_with_one_line(tmp_path, config):
    done = _pick(_apt(tmp_path, **config))
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no Debian archive in the apt configuration")
    assert str(tmp_path) in lines[0]


def test_the_repository_names_no_mirror_host():
    """No deploy or CI file carries a mirror of its own (it would bypass the machine's)."""
    hosts = ("deb.debian.org", "ftp.debian.org", "httpredir.debian.org", "mirrors.")
    files = [
        *REPO.joinpath("deploy").rglob("*"),
        *REPO.joinpath(".ci").rglob("*"),
        *REPO.joinpath("scripts").rglob("*"),
    ]
    for path in files:
        if path.is_file() and path.suffix not in (".png", ".gz"):
            text = path.read_text(errors="replace")
            assert not [h for h in hosts if h in text], path
