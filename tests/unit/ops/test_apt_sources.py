"""The debootstrap mirror comes from the host's apt sources, in either format apt reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.ops.deploy.apt_sources import mirror_for, source_files

DEB822 = """\
Types: deb
# a comment inside the stanza
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main contrib
"""


def apt_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_deb822_sources_give_the_uri_of_the_suite_itself(tmp_path: Path) -> None:
    apt = apt_dir(tmp_path, {"sources.list.d/debian.sources": DEB822})

    assert mirror_for("bookworm", source_files(apt)) == "http://mirror.example/debian"


def test_one_line_sources_skip_options_comments_and_other_suites(tmp_path: Path) -> None:
    text = (
        "# deb http://commented.example/debian bookworm main\n"
        "deb http://other.example/debian bookworm-updates main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian bookworm main\n"
    )
    apt = apt_dir(tmp_path, {"sources.list": text})

    assert mirror_for("bookworm", source_files(apt)) == "http://mirror.example/debian"


def test_sources_list_comes_first_and_files_apt_ignores_are_ignored(tmp_path: Path) -> None:
    apt = apt_dir(
        tmp_path,
        {
            "sources.list": "deb http://first.example/debian bookworm main\n",
            "sources.list.d/a.list.disabled": "deb http://disabled.example/debian bookworm main\n",
            "sources.list.d/b.sources": DEB822,
        },
    )

    files = source_files(apt)

    assert [f.name for f in files] == ["sources.list", "b.sources"]
    assert mirror_for("bookworm", files) == "http://first.example/debian"


def test_a_disabled_stanza_or_one_without_main_does_not_count(tmp_path: Path) -> None:
    text = (
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n"
        "Types: deb\nURIs: http://nonfree.example/debian\nSuites: bookworm\nComponents: non-free\n\n"
        "Types: deb\nURIs: http://on.example/debian\nSuites: bookworm\nComponents: main\n"
    )
    apt = apt_dir(tmp_path, {"sources.list.d/debian.sources": text})

    assert mirror_for("bookworm", source_files(apt)) == "http://on.example/debian"


def test_no_source_for_the_suite_is_a_clear_error_naming_the_variable(tmp_path: Path) -> None:
    apt = apt_dir(tmp_path, {"sources.list.d/debian.sources": DEB822})

    with pytest.raises(LookupError, match="suite 'trixie'.*set DEBIAN_MIRROR"):
        mirror_for("trixie", source_files(apt))
