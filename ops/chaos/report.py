"""The result of `pagedserve chaos`: one JSON document, and the same as rich tables in a terminal.

The verdict is computed once, here: lost requests, leaked blocks, broken invariants or a pool
that never became whole again fail the run.
"""

from __future__ import annotations

import statistics
from typing import Any

from pagedserve.ops.chaos.load import LoadOutcome
from pagedserve.ops.chaos.watch import Kill
from rich.console import Console
from rich.table import Table


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"max": None, "mean": None}
    return {"max": round(max(values), 3), "mean": round(statistics.fmean(values), 3)}


def build_report(
    settings: dict[str, Any],
    deployment: dict[str, Any],
    load: LoadOutcome,
    kills: list[Kill],
    skipped_kills: int,
    t0: float,
    final_blocks: dict[str, Any] | None,
    settled: bool,
    settle_s: float,
) -> dict[str, Any]:
    totals = (final_blocks or {}).get("totals", {})
    invariants = (final_blocks or {}).get("invariants", {})
    pools = (final_blocks or {}).get("pools", [])
    blocks = {
        "read": final_blocks is not None,
        "leaked": totals.get("leaked"),
        "invariants_ok": bool(invariants.get("ok", False)),
        "violations": invariants.get("violations", []),
        "pools": [{"worker_id": p["worker_id"], **p["totals"]} for p in pools],
        "totals": totals,
        "whole": settled,
        "settle_s": round(settle_s, 3),
    }
    detected = [d for k in kills if (d := k.detected_after_s()) is not None]
    whole = [w for k in kills if (w := k.whole_after_s()) is not None]
    failures = []
    if load.lost:
        failures.append(f"{load.lost} request(s) lost")
    if final_blocks is None:
        failures.append("/blocks could not be read")
    else:
        if totals.get("leaked", 0):
            failures.append(f"{totals['leaked']} block(s) leaked")
        if not blocks["invariants_ok"]:
            failures.append("block-manager invariants broken")
        if not settled:
            failures.append(f"pools not whole {settle_s:.0f} s after the load")
    undetected = sum(k.detected_at is None for k in kills)
    if undetected:
        failures.append(f"{undetected} kill(s) never noticed by the scheduler")
    return {
        "ok": not failures,
        "failures": failures,
        "settings": settings,
        "deployment": deployment,
        "requests": load.to_json(),
        "kills": [k.to_json(t0) for k in kills],
        "kills_skipped": skipped_kills,
        "detected_after_s": _stats(detected),
        "whole_after_s": _stats(whole),
        "blocks": blocks,
    }


def _s(value: float | None, unit: str = "s", digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f} {unit}"


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    req, blk = report["requests"], report["blocks"]
    summary = Table(title="pagedserve chaos", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row(
        "deployment", f"{report['deployment']['mode']}, {report['deployment']['workers']} workers"
    )
    summary.add_row("requests sent", str(req["sent"]))
    summary.add_row("finished", str(req["finished"]))
    errored = ", ".join(f"{code}: {n}" for code, n in sorted(req["errored"].items())) or "none"
    summary.add_row("errored", f"{req['errored_total']} ({errored})")
    summary.add_row("lost", _verdict(req["lost"] == 0, str(req["lost"])))
    summary.add_row("output tokens/s", f"{req['tokens_per_s']:.1f}")
    summary.add_row(
        "kills", f"{len(report['kills'])} ({report['kills_skipped']} skipped: too few ready workers)"
    )
    det, whole = report["detected_after_s"], report["whole_after_s"]
    summary.add_row("death noticed after", f"max {_s(det['max'])}, mean {_s(det['mean'])}")
    summary.add_row("pool whole after", f"max {_s(whole['max'])}, mean {_s(whole['mean'])}")
    summary.add_row("leaked blocks", _verdict(blk["leaked"] == 0, str(blk["leaked"])))
    summary.add_row("invariants", _verdict(blk["invariants_ok"], "ok" if blk["invariants_ok"] else "BROKEN"))
    pools = ", ".join(f"{p['worker_id']} {p['free']}/{p['total']}" for p in blk["pools"]) or "none"
    summary.add_row("pools free/total", _verdict(blk["whole"], f"{pools} (after {blk['settle_s']:.1f} s)"))
    console.print(summary)

    kills = Table(title="kills", title_justify="left")
    for name, justify in (
        ("#", "right"),
        ("at", "right"),
        ("victim", "left"),
        ("worker id", "left"),
        ("noticed after", "right"),
        ("whole after", "right"),
    ):
        kills.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, k in enumerate(report["kills"], 1):
        kills.add_row(
            str(i),
            _s(k["at_s"], "s", 1),
            k["victim"],
            k["worker_id"] or "?",
            _s(k["detected_after_s"], "s", 3),
            _s(k["whole_after_s"], "s", 2),
        )
    console.print(kills)
    if report["ok"]:
        console.print("[bold green]PASS[/]: nothing lost, nothing leaked, invariants hold")
    else:
        console.print("[bold red]FAIL[/]: " + "; ".join(report["failures"]))


def _verdict(good: bool, text: str) -> str:
    return f"[green]{text}[/]" if good else f"[bold red]{text}[/]"
