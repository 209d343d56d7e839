"""`pagedserve top`: the live view in a terminal, refreshed in place (rich's Live display).

It reads the same routes as the web page: the scheduler's `/view/sched` and the block manager's
`/view/pool`. Each pool is drawn as a strip of characters, each standing for a run of blocks and
coloured by the most alarming state in it (a leaked block is never hidden by its free neighbours),
above the workers, the requests and the last minutes of history as sparklines.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

STYLES = {
    "free": "grey30",
    "free_cached": "steel_blue",
    "held": "blue",
    "cached": "green",
    "shared": "magenta",
    "pending": "yellow",
    "expiring": "dark_orange",
    "leaked": "bold red",
    "broken": "bold bright_red on white",
}
# Which state a character shows when its blocks differ: the most alarming one.
SEVERITY = ("free", "free_cached", "held", "cached", "shared", "pending", "expiring", "leaked", "broken")
SPARKS = "▁▂▃▄▅▆▇█"
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, token: str | None, timeout_s: float = 3.0) -> dict[str, Any] | str:
    """The JSON of a view route, or a line saying why not."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with _opener.open(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        return f"{url}: HTTP {e.code} {e.read()[:120].decode(errors='replace')}"
    except (OSError, ValueError) as e:
        return f"{url}: {e}"


def render_top(
    pool: dict[str, Any] | str | None, sched: dict[str, Any] | str | None, width: int = 100
) -> RenderableType:
    parts: list[RenderableType] = [_header(pool, sched)]
    if isinstance(pool, dict):
        parts += [_pool_strip(p, pool["states"], width) for p in pool["pools"]]
        parts.append(_legend(pool))
        violations = pool["invariants"]["violations"]
        parts += [Text(f"  ✗ {v}", style="red") for v in violations[:5]]
    elif isinstance(pool, str):
        parts.append(Text(f"pool: {pool}", style="red"))
    if isinstance(sched, dict):
        parts += [_workers(sched["workers"]), _requests(sched), _history(pool, sched, width)]
    elif isinstance(sched, str):
        parts.append(Text(f"scheduler: {sched}", style="red"))
    return Group(*parts)


def _header(pool: Any, sched: Any) -> Text:
    text = Text("pagedserve top  ", style="bold")
    if isinstance(pool, dict):
        total = sum(p["num_blocks"] for p in pool["pools"])
        free = sum(p["free"] for p in pool["pools"])
        leaked = pool["by_state"]["leaked"]
        ok = pool["invariants"]["ok"]
        text.append("invariants ")
        text.append(
            "✓ ok" if ok else f"✗ {pool['invariants']['count']} broken",
            style="bold green" if ok else "bold red",
        )
        pct = 100 * (total - free) / total if total else 0.0
        text.append(f"  pool {total - free}/{total} used ({pct:.1f}%)  leaked ")
        text.append(str(leaked), style="bold red" if leaked else "green")
    if isinstance(sched, dict):
        f = sched["faults"]
        text.append(
            f"  running {sched['running']}  waiting {sched['waiting']}/{sched['max_waiting_requests']}"
        )
        text.append(f"  {sched['tokens_per_s']:.1f} tok/s  ")
        spec = sched.get("speculation")
        if spec and spec["enabled"]:
            text.append(
                f"spec accepted {spec['accepted']}/{spec['proposed']} ({100 * spec['acceptance']:.0f}%)  "
            )
        noticed = f["workers_lost"] + f["step_timeouts"] + f["stale_results"] + f["block_manager_outages"]
        text.append(
            f"faults {noticed:g} (lost {f['workers_lost']:g}, timeouts {f['step_timeouts']:g}, stale "
            f"{f['stale_results']:g}, bm outages {f['block_manager_outages']:g}; preemptions {f['preemptions']:g}, "
            f"rejected {f['rejected']:g})",
            style="bold red" if noticed else "",
        )
    return text


def _pool_strip(pool: dict[str, Any], states: Sequence[str], width: int, rows: int = 3) -> Group:
    codes = base64.b64decode(pool["states"])
    cells = max(1, min(len(codes), width * rows))
    per = -(-len(codes) // cells)
    strip = Text()
    severity = [SEVERITY.index(s) for s in states]
    for start in range(0, len(codes), per):
        worst = max(codes[start : start + per], key=lambda c: severity[c])
        strip.append("█", style=STYLES[states[worst]])
        if (start // per + 1) % width == 0:
            strip.append("\n")
    used = pool["num_blocks"] - pool["free"]
    title = Text(f"pool {pool['worker_id']}: {used}/{pool['num_blocks']} used", style="bold")
    title.append(f"  (one cell = {per} block{'s' if per > 1 else ''}, the worst state shown)", style="dim")
    return Group(title, strip.rstrip() or strip)


def _legend(pool: dict[str, Any]) -> Text:
    text = Text()
    for state in pool["states"]:
        text.append("█ ", style=STYLES[state])
        text.append(f"{state} {pool['by_state'][state]}   ")
    return text


def _workers(workers: list[dict[str, Any]]) -> Table:
    table = Table(title="workers", title_justify="left", box=None, header_style="bold")
    for name in (
        "worker",
        "state",
        "heartbeat",
        "step ms last/mean/max",
        "steps",
        "tokens",
        "restarts",
        "losses",
        "last loss",
    ):
        table.add_column(name, justify="left" if name in ("worker", "state", "last loss") else "right")
    for w in workers:
        ms = " / ".join(
            "–" if v is None else f"{v:.1f}" for v in (w["step_ms_last"], w["step_ms_mean"], w["step_ms_max"])
        )
        hb = "–" if w["last_heartbeat_age_s"] is None else f"{w['last_heartbeat_age_s']:.1f}s ago"
        table.add_row(
            w["worker_id"],
            Text(w["state"], style="green" if w["state"] == "active" else "bold red"),
            hb,
            ms,
            str(w["steps"]),
            str(w["tokens"]),
            Text(str(w["restarts"]), style="yellow" if w["restarts"] else ""),
            Text(str(w["losses"]), style="red" if w["losses"] else ""),
            Text(w["last_loss"], style="dim"),
        )
    return table


def _requests(sched: dict[str, Any], max_rows: int = 12) -> Table:
    title = f"requests: {sched['running']} running, {sched['waiting']} waiting"
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for name in ("request", "status", "worker", "prio", "blocks", "tokens", "age"):
        table.add_column(name, justify="left" if name in ("request", "status", "worker") else "right")
    rows = sched["requests"]
    for r in rows[:max_rows]:
        table.add_row(
            r["request_id"][:24],
            r["status"],
            r["worker_id"],
            str(r["priority"]),
            str(r["blocks"]),
            f"{r['prompt_tokens']}+{r['output_tokens']}/{r['max_tokens']}",
            f"{r['age_s']:.1f}s",
        )
    if len(rows) > max_rows:
        table.add_row("…", Text(f"{len(rows) - max_rows} more", style="dim"), "", "", "", "", "")
    return table


def sparkline(values: Sequence[float], width: int) -> str:
    values = list(values)[-width:]
    if not values:
        return ""
    top = max(values) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in values)


def _history(pool: Any, sched: dict[str, Any], width: int) -> Table:
    table = Table(title="last minutes (1 sample/s)", title_justify="left", box=None, show_header=False)
    table.add_column("what")
    table.add_column("now", justify="right")
    table.add_column("history")
    series: list[tuple[str, list[float]]] = []
    if isinstance(pool, dict):
        h = pool["history"]
        series.append(
            ("pool used %", [100 * u / t if t else 0.0 for u, t in zip(h["used"], h["total"], strict=True)])
        )
    h = sched["history"]
    series += [("waiting", h["waiting"]), ("step ms", h["step_ms"]), ("tok/s", h["tokens_per_s"])]
    for name, values in series:
        table.add_row(
            name, f"{values[-1]:.1f}" if values else "–", Text(sparkline(values, width - 24), style="cyan")
        )
    return table


def run_top(
    scheduler_url: str | None,
    block_manager_url: str | None,
    token: str | None,
    interval_s: float = 1.0,
    once: bool = False,
    console: Console | None = None,
) -> int:
    """Refresh until Ctrl-C (or one frame with `once`). Exit status of the last frame: 0, 1 when the
    invariants are broken, 2 when neither server could be read."""
    console = console or Console()

    def frame() -> tuple[RenderableType, int]:
        pool = fetch(f"{block_manager_url}/view/pool", token) if block_manager_url else None
        sched = fetch(f"{scheduler_url}/view/sched", token) if scheduler_url else None
        status = 0 if not isinstance(pool, dict) or pool["invariants"]["ok"] else 1
        if not isinstance(pool, dict) and not isinstance(sched, dict):
            status = 2  # nothing could be read
        return render_top(pool, sched, max(40, console.width - 2)), status

    if once:
        view, status = frame()
        console.print(view)
        return status
    status = 0
    try:
        with Live(console=console, auto_refresh=False, screen=True) as live:
            while True:
                view, status = frame()
                live.update(view, refresh=True)
                time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    return status
