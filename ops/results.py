"""Result files (bench/, chaos, microbenchmarks) name no machine: paths are written relative to the
repository, the model cache, the temp folder or the home folder, so a file reads the same wherever it
ran and says nothing of who ran it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]  # the checkout (an installed wheel has no repo: never matches)


def _bases() -> list[tuple[Path, str]]:
    """Most specific first: the cache usually lies under home, a checkout may lie under the temp folder."""
    cache = Path(os.environ.get("PAGEDSERVE_CACHE") or "~/.cache/pagedserve").expanduser()
    return [
        (cache, "$PAGEDSERVE_CACHE"),
        (REPO, "."),
        (Path(tempfile.gettempdir()), "$TMPDIR"),
        (Path.home(), "~"),
    ]


def portable_path(text: str) -> str:
    """An absolute path under one of the bases -> the same path from that base; anything else as is."""
    if not text.startswith("/"):
        return text
    path = Path(text)
    for base, name in _bases():
        for root in {base, base.resolve()}:
            if path == root or root in path.parents:
                return (Path(name) / path.relative_to(root)).as_posix()
    return text


def portable_text(text: str) -> str:
    """Free text (a command line, a server's log) with every path under one of the bases written from
    that base, wherever in the text it stands."""
    for base, name in _bases():
        for root in {base, base.resolve()}:
            if str(root) != "/":
                text = text.replace(f"{root}/", f"{name}/")
    return text


def portable(value: Any) -> Any:
    """`value` (a report: dicts, lists, strings, numbers) with every such path made portable."""
    if isinstance(value, str):
        return portable_text(portable_path(value))
    if isinstance(value, Path):
        return portable_path(str(value))
    if isinstance(value, dict):
        return {portable(k): portable(v) for k, v in value.items()}  # a key may be a command line
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    return value


def write_json(out: str | Path, report: Any, *, echo: bool = False) -> None:
    """Write a result file: indented JSON, paths made portable (anything else json cannot hold: str).
    `echo` prints the report first as it is: the run's own paths kept, to open its logs."""
    if echo:
        print(json.dumps(report, indent=2, default=str))
    Path(out).write_text(json.dumps(portable(report), indent=2, default=str) + "\n")


def save_report(out: Path, report: Any) -> int:
    """A benchmark's last step: its result file written (folders made), its path said; exit code 0."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, report)
    print(f"JSON: {out}")
    return 0
