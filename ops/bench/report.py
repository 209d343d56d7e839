"""What `pagedserve bench` hands back: the report dict (written as JSON), its table, its chart."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pagedserve.ops.bench.peers import PathResult

SPEEDUP_TARGET = 2.0  # pagedserve over the best transformers path
KV_UTILIZATION_TARGET = 0.95
SERVICES_RATIO_TARGET = 0.95  # services over in-process, per depth
IDLE_TARGET = 0.05  # worker idle fraction at depth 2
IDLE_TARGET_DEPTH = 2


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    from pagedserve.kernels.cpu.dispatch import kernel_paths
    from pagedserve.kernels.cpu.isa import cpu_flags, cpu_model, preferred_isas

    return {
        "cpu_model": cpu_model(),
        # What the speed depends on: the vector ISA the CPU has, what our kernels and ATen ran.
        "cpu_vector_flags": sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma"))),
        "kernel_isa": preferred_isas()[0],
        "kernel_paths": kernel_paths(),
        # How quantized linears take their activations (services/worker/layers/quant_linear.py).
        "quant_activations": os.environ.get("PAGEDSERVE_QUANT_ACTIVATIONS") or "float32",
        "kv_cache_dtype": os.environ.get("PAGEDSERVE_KV_CACHE_DTYPE") or "auto",  # a served run's, if set so
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),  # 1, 5, 15 min, at the end of the run
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _ratio(num: float, den: float) -> float | None:
    return num / den if num > 0 and den > 0 else None


def build_report(
    *,
    config: dict[str, Any],
    workload: dict[str, Any],
    paths: list[PathResult],
    services: list[PathResult],
    max_len_kv: dict[str, Any],
    efficiency: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every number the table shows, with the ratios and targets worked out once, here.
    `efficiency` (efficiency.efficiency_json) adds each path's model FLOP/s and its share of the ceiling."""
    by_name = {p.name: p for p in paths}
    ours = by_name.get("pagedserve")
    ours_tps = ours.tokens_per_s if ours else 0.0
    hf = [p for p in paths if p.name.startswith("hf-") and p.error is None]
    best_hf = max(hf, key=lambda p: p.tokens_per_s, default=None)
    statics = [p for p in hf if p.name.startswith("hf-static")]
    best_static = max(statics, key=lambda p: p.tokens_per_s, default=None)
    rows = [
        {**p.to_json(), "pagedserve_ratio": _ratio(ours_tps, p.tokens_per_s), **_efficiency(p, efficiency)}
        for p in paths
    ]
    service_rows = []
    for s in services:
        depth = s.details["pipeline_depth"]
        row = {
            **s.to_json(),
            "services_over_in_process": _ratio(s.tokens_per_s, ours_tps),
            **_efficiency(s, efficiency),
        }
        row["ratio_met"] = row["services_over_in_process"] is not None and (
            row["services_over_in_process"] >= SERVICES_RATIO_TARGET
        )
        if depth == IDLE_TARGET_DEPTH and s.error is None:
            row["idle_met"] = s.details["idle_fraction"] < IDLE_TARGET
        service_rows.append(row)
    speedup = _ratio(ours_tps, best_hf.tokens_per_s) if best_hf else None
    kv = ours.details.get("kv_utilization") if ours and ours.error is None else None
    return {
        "config": config,
        "workload": workload,
        "efficiency": efficiency,
        "paths": rows,
        "best_hf_static": best_static.name if best_static else None,
        "best_hf": best_hf.name if best_hf else None,
        "kv_utilization": {
            "pagedserve": kv,
            "static_batches": {p.name: p.details.get("kv_utilization") for p in statics},
            "max_model_len_preallocation": max_len_kv,
        },
        "services": service_rows,
        "targets": {
            "speedup": {
                "value": speedup,
                "target": SPEEDUP_TARGET,
                "met": speedup is not None and speedup >= SPEEDUP_TARGET,
            },
            "kv_utilization": {
                "value": kv,
                "target": KV_UTILIZATION_TARGET,
                "met": kv is not None and kv >= KV_UTILIZATION_TARGET,
            },
        },
    }


def _efficiency(path: PathResult, efficiency: dict[str, Any] | None) -> dict[str, float | None]:
    """Model FLOP/s = the workload's model FLOPs / the path's timed seconds; and that over the ceiling."""
    if efficiency is None:
        return {}
    ran = path.error is None and path.wall_s > 0
    achieved = efficiency["model_flops"]["total"] / path.wall_s if ran else None
    return {
        "model_flop_per_s": achieved,
        "ceiling_fraction": _ratio(achieved or 0.0, efficiency["ceiling_flop_per_s"]),
    }


def _giga(value: float | None) -> float | None:
    return None if value is None else value / 1e9


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def _met(flag: bool | None) -> str:
    return "[green]met[/]" if flag else "[red]missed[/]"


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    # Not a terminal (a log file, a pipe): rich would assume 80 columns and wrap every name.
    console = console or Console(width=None if sys.stdout.isatty() else 140)
    w = report["workload"]
    table = Table(
        title=f"pagedserve bench — {w['num_requests']} requests, {w['output_tokens']} output tokens, "
        f"{report['config']['dtype']}, {report['machine']['torch_threads']} threads"
    )
    for name, justify in (
        ("path", "left"),
        ("tok/s", "right"),
        ("wall s", "right"),
        ("out tokens", "right"),
        ("pagedserve ÷ path", "right"),
        ("KV util", "right"),
        ("GFLOP/s", "right"),
        ("of ceiling", "right"),
        ("note", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=name == "path")  # type: ignore[arg-type]
    best = {report["best_hf_static"], report["best_hf"]}
    for row in report["paths"]:
        note = row["error"] or (
            "best transformers"
            if row["name"] == report["best_hf"]
            else "best static"
            if row["name"] in best
            else ""
        )
        table.add_row(
            row["name"],
            _fmt(row["tokens_per_s"] if not row["error"] else None),
            _fmt(row["wall_s"] or None),
            str(row["output_tokens"] or "—"),
            _fmt(row["pagedserve_ratio"], ".2f", "x"),
            _fmt(row.get("kv_utilization"), ".1%"),
            _fmt(_giga(row.get("model_flop_per_s"))),
            _fmt(row.get("ceiling_fraction"), ".1%"),
            note,
        )
    max_len = report["kv_utilization"]["max_model_len_preallocation"]
    table.add_row(
        f"pre-allocate max_model_len ({max_len['max_model_len']})",
        "",
        "",
        "",
        "",
        _fmt(max_len["kv_utilization"], ".1%"),
        "",
        "",
        "KV only: tokens / max len",
    )
    console.print(table)
    if report.get("efficiency"):
        _print_efficiency(report["efficiency"], console)
    machine = report["machine"]
    start, end, cores = machine["load_average_at_start"][0], machine["load_average"][0], machine["cores"] or 1
    busy = " — a busy machine: compare paths with care" if max(start, end) > cores else ""
    console.print(f"load average {start:.1f} at start, {end:.1f} at end ({cores} cores){busy}")
    for key, label in (("speedup", "pagedserve ÷ best transformers"), ("kv_utilization", "KV utilisation")):
        t = report["targets"][key]
        spec, suffix = (".2f", "x") if key == "speedup" else (".1%", "")
        target = f"{t['target']:.0%}" if key == "kv_utilization" else f"{t['target']:.1f}x"
        verdict = "not measured" if t["value"] is None else _met(t["met"])
        console.print(f"target {label} >= {target}: {_fmt(t['value'], spec, suffix)} {verdict}")
    if report["services"]:
        _print_services(report, console)


def _print_efficiency(efficiency: dict[str, Any], console: Console) -> None:
    flops = efficiency["model_flops"]
    probes = efficiency["ceiling_probes"]
    m, k, n = probes[0]["shape_mkn"]
    console.print(
        f"model FLOPs of the workload: {flops['total'] / 1e9:.1f} G (layer matmuls "
        f"{flops['layer_matmuls'] / 1e9:.1f}, LM head {flops['lm_head'] / 1e9:.1f}, attention "
        f"{flops['attention'] / 1e9:.1f}); ceiling: the best GEMM (torch.mm or oneDNN packed, "
        f"{'/'.join(p.get('kernel', 'torch.mm') for p in probes)}) [{m}x{k}]x[{k}x{n}] {probes[0]['dtype']}, "
        f"{probes[0]['threads']} threads, "
        + " / ".join(f"{p['flop_per_s'] / 1e9:.1f}" for p in probes)
        + " GFLOP/s before / after the paths"
    )


def _print_services(report: dict[str, Any], console: Console) -> None:
    table = Table(title="services (supervisor, 1 worker, AsyncClient) vs in-process")
    for name in (
        "depth",
        "tok/s",
        "wall s",
        "services ÷ in-process",
        "worker idle",
        "in steps",
        "steps",
        "GFLOP/s",
        "of ceiling",
        "note",
    ):
        table.add_column(name, justify="left" if name in ("depth", "note") else "right")
    for row in report["services"]:
        table.add_row(
            str(row["pipeline_depth"]),
            _fmt(row["tokens_per_s"] if not row["error"] else None),
            _fmt(row["wall_s"] or None),
            _fmt(row["services_over_in_process"], ".3f", "x"),
            _fmt(row.get("idle_fraction"), ".1%"),
            _fmt(row.get("busy_fraction"), ".1%"),
            str(row.get("steps", "—")),
            _fmt(_giga(row.get("model_flop_per_s"))),
            _fmt(row.get("ceiling_fraction"), ".1%"),
            row["error"] or "",
        )
    console.print(table)
    for row in report["services"]:
        console.print(
            f"depth {row['pipeline_depth']}: services ÷ in-process >= {SERVICES_RATIO_TARGET:.2f}: "
            f"{_met(row['ratio_met'])}"
        )
        if "idle_met" in row:
            console.print(
                f"depth {row['pipeline_depth']}: worker idle < {IDLE_TARGET:.0%}: {_met(row['idle_met'])}"
            )


def write_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here; a file is all we want
    import matplotlib.pyplot as plt

    rows = [r for r in report["paths"] if not r["error"]]
    rows += [{**r, "name": r["name"]} for r in report["services"] if not r["error"]]
    kv = report["kv_utilization"]
    kv_bars = {
        "pagedserve": kv["pagedserve"],
        **kv["static_batches"],
        f"max_model_len={kv['max_model_len_preallocation']['max_model_len']}": kv[
            "max_model_len_preallocation"
        ]["kv_utilization"],
    }
    kv_bars = {k: v for k, v in kv_bars.items() if v is not None}
    fig, (ax_tps, ax_kv) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    names = [r["name"] for r in rows]
    colors = [
        "tab:green" if n == "pagedserve" else "tab:olive" if n.startswith("services") else "tab:gray"
        for n in names
    ]
    bars = ax_tps.bar(names, [r["tokens_per_s"] for r in rows], color=colors)
    ax_tps.bar_label(bars, fmt="%.1f", fontsize=8)
    ax_tps.set_ylabel("output tokens / s")
    ax_tps.set_title(
        f"throughput ({report['workload']['num_requests']} requests, {report['config']['dtype']})"
    )
    ax_tps.tick_params(axis="x", rotation=30, labelsize=8)
    kv_b = ax_kv.bar(
        list(kv_bars),
        [v * 100 for v in kv_bars.values()],
        color=["tab:green"] + ["tab:gray"] * (len(kv_bars) - 1),
    )
    ax_kv.bar_label(kv_b, fmt="%.0f%%", fontsize=8)
    ax_kv.axhline(KV_UTILIZATION_TARGET * 100, color="tab:red", linestyle="--", linewidth=1)
    ax_kv.set_ylabel("KV slots holding tokens, %")
    ax_kv.set_ylim(0, 105)
    ax_kv.set_title("KV-cache utilisation")
    ax_kv.tick_params(axis="x", rotation=30, labelsize=8)
    fig.suptitle(f"{report['machine']['cpu_model']}, {report['machine']['date']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
