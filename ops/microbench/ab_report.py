"""What every A/B microbench does around its measurement: the load average on both sides (the
cores are shared, so a number without it means little) and the JSON report."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pagedserve.ops.results import write_json


def measured(rows: Callable[[], list[dict[str, Any]]], **settings: Any) -> dict[str, Any]:
    """Run `rows()` between two readings of the load average; the report with `settings` first."""
    load_start = os.getloadavg()
    print(f"load average at start: {load_start}")
    found = rows()
    report = {**settings, "load_average_at_start": load_start, "load_average_at_end": os.getloadavg()}
    report["rows"] = found
    print(f"load average at end: {report['load_average_at_end']}")
    return report


def write_report(out: Path | None, report: dict[str, Any]) -> None:
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, report)
