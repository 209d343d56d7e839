"""A service's JSON log (log_format="json", one structlog record a line) read back: the records of one
event, for the benchmarks and tests that learn what a deployment did from what it said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    """The records of `path` whose event is `event`, in order; a line cut short (a killed process) or
    not JSON (a traceback) is skipped."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"{event}"' not in line:  # most lines: no parse
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found
