"""The result of `pagedserve chaos`: one JSON document, and the same as rich tables in a terminal.

The verdict is computed once, here: lost requests, wrong outputs, broken streams, errors while a
worker could serve, leaked blocks, broken invariants, a pool that never became whole again, or a
fault never noticed or recovered from fail the run.
"""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from pagedserve.ops.chaos.faults import Fault
from pagedserve.ops.chaos.load import LoadOutcome


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"max": None, "mean": None, "median": None}
    return {
        "max": round(max(values), 3),
        "mean": round(statistics.fmean(values), 3),
        "median": round(statistics.median(values), 3),
    }


def build_report(
    settings: dict[str, Any],
    deployment: dict[str, Any],
    load: LoadOutcome,
    faults: list[Fault],
    skipped: dict[str, int],
    t0: float,
    final_blocks: dict[str, Any] | None,
    settled: bool,
    settle_s: float,
    outputs: dict[str, Any],
    timeline: dict[str, Any],
    unavailable: list[str] | None = None,
    kv: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`kv`: the scheduler's KV counters over the run (resumed requests, prefill tokens computed again
    after a worker was lost), and later the segments left once the deployment stopped."""
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
    failures = []
    if load.lost:
        failures.append(f"{load.lost} request(s) lost: {load.lost_detail}")
    if outputs["wrong"]:
        failures.append(f"{outputs['wrong']} output(s) differ from the fault-free reference")
    if outputs["streams_broken"] or outputs["stream_text_mismatch"]:
        failures.append(
            f"{outputs['streams_broken']} stream(s) with duplicated or missing tokens, "
            f"{outputs['stream_text_mismatch']} with other text than the result"
        )
    if outputs["errored_while_workers_ready"]:
        failures.append(
            f"{outputs['errored_while_workers_ready']} request(s) errored while a worker was ready"
        )
    if final_blocks is None:
        failures.append("/blocks could not be read")
    else:
        if totals.get("leaked", 0):
            failures.append(f"{totals['leaked']} block(s) leaked")
        if not blocks["invariants_ok"]:
            failures.append("block-manager invariants broken")
        if not settled:
            failures.append(f"pools not whole {settle_s:.0f} s after the load")
    unrecovered = [f for f in faults if f.recovered_at is None]
    if unrecovered:
        failures.append(
            f"{len(unrecovered)} fault(s) never recovered from: {sorted({f.kind for f in unrecovered})}"
        )
    # A kill must be seen; a long pause too (past the worker timeout). A short pause should not be.
    unseen = [f for f in faults if f.noticed_at is None and f.kind != "worker_pause_short"]
    if unseen:
        failures.append(f"{len(unseen)} fault(s) never noticed: {sorted({f.kind for f in unseen})}")
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({f.kind for f in faults} | set(skipped)):
        mine = [f for f in faults if f.kind == kind]
        by_kind[kind] = {
            "count": len(mine),
            "skipped": skipped.get(kind, 0),
            "noticed": sum(f.noticed_at is not None for f in mine),
            "noticed_after_s": _stats([f.noticed_at - f.at for f in mine if f.noticed_at is not None]),
            "recovered_after_s": _stats([f.recovered_at - f.at for f in mine if f.recovered_at is not None]),
        }
    api_kills = api_kill_survival(load, faults)
    if (
        api_kills["streams_open"]
        and not api_kills["streams_survived"]
        and deployment.get("api_processes", 0) > 1
    ):
        failures.append(
            f"API kills broke all {api_kills['streams_open']} open stream(s), "
            f"though {deployment['api_processes']} API processes serve"
        )
    return {
        "ok": not failures,
        "failures": failures,
        "api_kills": api_kills,
        "settings": settings,
        "deployment": deployment,
        "requests": load.to_json(),
        "outputs": outputs,
        "faults": [f.to_json(t0) for f in faults],
        "faults_total": len(faults),
        "faults_skipped": sum(skipped.values()),
        "faults_unavailable": unavailable or [],
        "by_kind": by_kind,
        "blocks": blocks,
        "kv": kv or {},
        "timeline": timeline,
    }


def add_segments_left(report: dict[str, Any], left: int | None) -> None:
    """After the deployment stopped: KV segments still in shared memory (None: not ours to check)."""
    report.setdefault("kv", {})["segments_left"] = left
    if left:
        report["failures"].append(f"{left} KV segment(s) left in shared memory after the deployment stopped")
        report["ok"] = False


# A stream the kill broke fails within this long of the SIGKILL (its connection is reset at once).
BROKEN_WITHIN_S = 5.0


def api_kill_survival(load: LoadOutcome, faults: list[Fault]) -> dict[str, int]:
    """Over every API kill: the HTTP streams open at the kill, and how many it broke. With several
    API processes on the port, a kill should break only the streams of the process it hit."""
    opened = broken = 0
    for fault in (f for f in faults if f.kind == "api_kill"):
        live = [
            r
            for r in load.records
            if r.via == "api" and r.started <= fault.at and (r.ended is None or r.ended > fault.at)
        ]
        opened += len(live)
        broken += sum(any(fault.at <= t < fault.at + BROKEN_WITHIN_S for t in r.interrupted_at) for r in live)
    return {"streams_open": opened, "streams_broken": broken, "streams_survived": opened - broken}


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
    via_api = req.get("via_api", 0)
    summary.add_row(
        "requests sent",
        str(req["sent"])
        + (
            f" ({via_api} through the HTTP API, {req.get('api_interrupted', 0)} re-sent after an API kill)"
            if via_api
            else ""
        ),
    )
    kills = report.get("api_kills", {})
    if kills.get("streams_open"):
        summary.add_row(
            "streams at API kills",
            f"{kills['streams_open']} open, {kills['streams_broken']} broken, {kills['streams_survived']} went on",
        )
    summary.add_row("finished", str(req["finished"]))
    errored = ", ".join(f"{code}: {n}" for code, n in sorted(req["errored"].items())) or "none"
    summary.add_row("errored", f"{req['errored_total']} ({errored})")
    summary.add_row("lost", _verdict(req["lost"] == 0, str(req["lost"])))
    summary.add_row("output tokens/s", f"{req['tokens_per_s']:.1f}")
    out = report["outputs"]
    checked = f"{out['compared']} compared" if out["checked_against_reference"] else "no reference run"
    summary.add_row("wrong outputs", _verdict(out["wrong"] == 0, f"{out['wrong']} ({checked})"))
    summary.add_row(
        "stream tokens dup/missing",
        _verdict(
            not out["streams_broken"],
            f"{out['duplicated_stream_tokens']}/{out['missing_stream_tokens']} "
            f"({out['streams_broken']} broken streams)",
        ),
    )
    summary.add_row(
        "errored while a worker was ready",
        _verdict(out["errored_while_workers_ready"] == 0, str(out["errored_while_workers_ready"])),
    )
    unavailable = ", ".join(report["faults_unavailable"]) or "none"
    summary.add_row(
        "faults", f"{report['faults_total']} ({report['faults_skipped']} skipped; unavailable: {unavailable})"
    )
    summary.add_row("leaked blocks", _verdict(blk["leaked"] == 0, str(blk["leaked"])))
    summary.add_row("invariants", _verdict(blk["invariants_ok"], "ok" if blk["invariants_ok"] else "BROKEN"))
    pools = ", ".join(f"{p['worker_id']} {p['free']}/{p['total']}" for p in blk["pools"]) or "none"
    summary.add_row("pools free/total", _verdict(blk["whole"], f"{pools} (after {blk['settle_s']:.1f} s)"))
    kv = report.get("kv", {})
    if kv:
        recomputed = kv.get("recomputed_prefill_tokens")
        summary.add_row(
            "requests resumed / prefill tokens recomputed",
            f"{kv.get('resumed_requests', 0):.0f} / " + _verdict(not recomputed, f"{recomputed or 0:.0f}"),
        )
        left = kv.get("segments_left")
        summary.add_row("KV segments left", "not checked" if left is None else _verdict(left == 0, str(left)))
    console.print(summary)

    kinds = Table(title="faults by kind", title_justify="left")
    for name, justify in (
        ("kind", "left"),
        ("count", "right"),
        ("skipped", "right"),
        ("noticed", "right"),
        ("noticed after (max / mean)", "right"),
        ("recovered after (median / max)", "right"),
    ):
        kinds.add_column(name, justify=justify)  # type: ignore[arg-type]
    for kind, k in report["by_kind"].items():
        kinds.add_row(
            kind,
            str(k["count"]),
            str(k["skipped"]),
            str(k["noticed"]),
            f"{_s(k['noticed_after_s']['max'])} / {_s(k['noticed_after_s']['mean'])}",
            f"{_s(k['recovered_after_s']['median'])} / {_s(k['recovered_after_s']['max'])}",
        )
    console.print(kinds)
    if report["ok"]:
        console.print("[bold green]PASS[/]: nothing lost, no wrong output, no broken stream, nothing leaked")
    else:
        console.print("[bold red]FAIL[/]: " + "; ".join(report["failures"]))


def _verdict(good: bool, text: str) -> str:
    return f"[green]{text}[/]" if good else f"[bold red]{text}[/]"
