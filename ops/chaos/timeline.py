"""The PNG timeline of a chaos run: requests in flight, pool usage and ready workers over time, with
every fault (a line at the signal, a band over a pause) and every restart the supervisor made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {
    "worker_kill": "tab:red",
    "worker_pause_short": "tab:olive",
    "worker_pause_long": "tab:orange",
    "scheduler_kill": "tab:purple",
    "block_manager_kill": "tab:brown",
    "api_kill": "tab:pink",
}


def write_timeline(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    timeline = report["timeline"]
    rows = timeline["samples"]
    t = [r[0] for r in rows]
    fig, (ax_req, ax_pool, ax_work) = plt.subplots(3, 1, figsize=(12, 7), sharex=True)
    ax_req.plot(t, [r[1] for r in rows], color="tab:blue", lw=1)
    ax_req.set_ylabel("in flight")
    usage = [None if r[3] is None or not r[4] else 100.0 * r[3] / r[4] for r in rows]
    ax_pool.plot(t, usage, color="tab:green", lw=1)
    ax_pool.set_ylabel("KV used %")
    ax_pool.set_ylim(0, 100)
    ax_work.step(t, [-0.5 if r[2] is None else r[2] for r in rows], where="post", color="black", lw=1)
    ax_work.set_ylabel("ready workers")
    ax_work.set_xlabel("seconds (ready = -0.5: the scheduler did not answer)")
    seen: set[str] = set()
    for fault in report["faults"]:
        colour = COLOURS.get(fault["kind"], "gray")
        label = None if fault["kind"] in seen else fault["kind"]
        seen.add(fault["kind"])
        for ax in (ax_req, ax_pool, ax_work):
            if fault["pause_s"]:
                ax.axvspan(fault["at_s"], fault["at_s"] + fault["pause_s"], color=colour, alpha=0.2)
            ax.axvline(fault["at_s"], color=colour, lw=0.8, label=label if ax is ax_req else None)
    for at, _name in timeline["restarts"]:
        ax_work.plot([at], [0], marker="^", color="tab:gray", ms=5)
    req, out = report["requests"], report["outputs"]
    fig.suptitle(
        f"pagedserve chaos: {report['faults_total']} faults, {req['sent']} sent, {req['finished']} finished, "
        f"{req['errored_total']} errored, {req['lost']} lost, {out['wrong']} wrong, "
        f"{out['duplicated_stream_tokens']}/{out['missing_stream_tokens']} dup/missing stream tokens, "
        f"{report['blocks']['leaked']} leaked; ^ = restart",
        fontsize=9,
    )
    if seen:
        # Above the line, not on it: in flight sits at the concurrency most of the run.
        ax_req.set_ylim(0, max([r[1] for r in rows] + [1]) * 1.45)
        ax_req.legend(loc="upper center", fontsize=7, ncol=len(seen))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
