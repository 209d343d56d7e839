"""The Debian mirror this machine's apt already uses, read from /etc/apt/sources.list{,.d/*}.

ops/compose_e2e.sh debootstraps its base image from it, so the run reaches the mirror the host is
configured for (a local one, a proxy) and the repository names none. Both formats apt reads:

    deb [signed-by=...] http://mirror/debian bookworm main          (sources.list, *.list)

    Types: deb                                                      (deb822, *.sources)
    URIs: http://mirror/debian
    Suites: bookworm bookworm-updates
    Components: main
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

APT_DIR = Path("/etc/apt")


@dataclass(frozen=True, slots=True)
class Source:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def source_files(apt_dir: Path = APT_DIR) -> list[Path]:
    """In apt's order: sources.list, then sources.list.d/ by name (only *.list and *.sources count)."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    return [f for f in files if f.is_file()]


def one_line_sources(text: str) -> Iterator[Source]:
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            yield Source(words[0], (words[1],), tuple(words[2:]))


def deb822_sources(text: str) -> Iterator[Source]:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield Source(
                uri, tuple(fields.get("suites", "").split()), tuple(fields.get("components", "").split())
            )


def sources(files: Iterable[Path]) -> Iterator[Source]:
    for path in files:
        text = path.read_text(errors="replace")
        yield from deb822_sources(text) if path.suffix == ".sources" else one_line_sources(text)


def mirror_for(suite: str, files: list[Path]) -> str:
    """The first source that serves `suite` itself (not -updates or -security) with `main`."""
    for source in sources(files):
        if suite in source.suites and "main" in source.components:
            return source.uri.rstrip("/")
    names = ", ".join(str(f) for f in files) or "no apt source files"
    raise LookupError(
        f"no 'deb' source for suite {suite!r} with component main in {names}: set DEBIAN_MIRROR"
    )
