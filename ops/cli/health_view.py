"""`pagedserve health`: the block manager's /blocks dump, readable in a terminal.

Per pool a table of blocks; in big pools runs of free blocks collapse into one row, since the
interesting rows are the held ones. Then totals, leases and the invariants (green or red).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

HASH_PREFIX = 8
COMPACT_ABOVE = 64  # pools with more blocks than this collapse runs of free blocks


def render_blocks(dump: dict[str, Any], show_all: bool = False, max_rows: int = 200) -> RenderableType:
    parts: list[RenderableType] = [_pool_panel(pool, show_all, max_rows) for pool in dump.get("pools", [])]
    if not dump.get("pools"):
        parts.append(Text("no pools registered (no worker has connected)", style="yellow"))
    parts.append(_leases_table(dump.get("leases", []), max_rows))
    parts.append(_totals_table(dump.get("totals", {})))
    parts.append(_invariants(dump.get("invariants", {})))
    return Group(*parts)


def print_blocks(dump: dict[str, Any], console: Console | None = None, **options: Any) -> None:
    (console or Console()).print(render_blocks(dump, **options))


# ---------------------------------------------------------------- pools


def _pool_panel(pool: dict[str, Any], show_all: bool, max_rows: int) -> Panel:
    blocks = pool.get("blocks", [])
    compact = not show_all and len(blocks) > COMPACT_ABOVE
    table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
    for name, justify in (
        ("id", "right"),
        ("refs", "right"),
        ("owners", "left"),
        ("hash", "left"),
        ("lease", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    rows = list(_rows(blocks, compact))
    for row in rows[:max_rows]:
        table.add_row(*row)
    if len(rows) > max_rows:
        table.add_row("…", "", Text(f"{len(rows) - max_rows} more rows (--max-rows)", style="dim"), "", "")
    title = f"pool [bold]{pool.get('worker_id')}[/]: {pool.get('num_blocks')} blocks × {pool.get('block_size')} tokens"
    summary = Text.from_markup(_totals_line(pool.get("totals", {})))
    return Panel(Group(summary, table), title=title, title_align="left")


def _rows(blocks: Sequence[dict[str, Any]], compact: bool) -> Iterator[tuple[RenderableType, ...]]:
    run: list[dict[str, Any]] = []
    for block in blocks:
        if compact and _is_free(block):
            run.append(block)
            continue
        if run:
            yield _free_run_row(run)
            run = []
        yield _block_row(block)
    if run:
        yield _free_run_row(run)


def _is_free(block: dict[str, Any]) -> bool:
    return block.get("ref_count", 0) == 0 and not block.get("owners")


def _block_row(block: dict[str, Any]) -> tuple[RenderableType, ...]:
    refs = block.get("ref_count", 0)
    expires = block.get("lease_expires_in_s")
    leaked = refs > 0 and (expires is None or expires <= 0)
    refs_style = "red bold" if leaked else ("cyan" if refs > 1 else "")  # >1: shared (prefix or fork)
    return (
        str(block.get("id")),
        Text(str(refs), style=refs_style),
        _owners(block.get("owners", [])),
        Text((block.get("hash") or "")[:HASH_PREFIX] or "—", style="dim" if refs == 0 else ""),
        _lease(expires, refs),
    )


def _free_run_row(run: list[dict[str, Any]]) -> tuple[RenderableType, ...]:
    if len(run) == 1:
        return _block_row(run[0])
    cached = sum(1 for b in run if b.get("hash"))
    note = f"{len(run)} free" + (f", {cached} hold a cached prefix" if cached else "")
    return (
        f"{run[0].get('id')}–{run[-1].get('id')}",
        Text("0", style="dim"),
        Text(note, style="green dim"),
        "",
        "",
    )


def _owners(owners: Sequence[str], limit: int = 3) -> Text:
    shown = ", ".join(owners[:limit])
    if len(owners) > limit:
        shown += f" +{len(owners) - limit}"
    return Text(shown or "—", style="" if owners else "dim")


def _lease(expires: float | None, refs: int) -> Text:
    if expires is None:
        return Text("none" if refs > 0 else "—", style="red" if refs > 0 else "dim")
    if expires <= 0:
        return Text(f"expired {-expires:.1f}s ago", style="red")
    return Text(f"{expires:.1f}s", style="yellow" if expires < 2.0 else "")


# ---------------------------------------------------------------- totals, leases, invariants


def _totals_line(totals: dict[str, Any]) -> str:
    leaked = totals.get("leaked", 0)
    leaked_part = f"[red bold]{leaked} leaked[/]" if leaked else "0 leaked"
    return f"{totals.get('used', 0)} used, {totals.get('free', 0)} free, {totals.get('cached', 0)} cached, {leaked_part}"


def _totals_table(totals: dict[str, Any]) -> Table:
    table = Table(title="totals", title_justify="left", box=None, header_style="bold")
    keys = ("total", "used", "free", "cached", "leaked")
    for key in keys:
        table.add_column(key, justify="right")
    leaked = totals.get("leaked", 0)
    cells = [str(totals.get(k, 0)) for k in keys[:-1]] + [
        Text(str(leaked), style="red bold" if leaked else "green")
    ]
    table.add_row(*cells)
    return table


def _leases_table(leases: Sequence[dict[str, Any]], max_rows: int) -> RenderableType:
    if not leases:
        return Text("leases: none", style="dim")
    table = Table(title=f"leases ({len(leases)})", title_justify="left", box=None, header_style="bold")
    for name in ("request", "owner", "pool", "blocks", "expires in"):
        table.add_column(name)
    for lease in sorted(leases, key=lambda x: x.get("expires_in_s", 0))[:max_rows]:
        table.add_row(
            str(lease.get("request_id")),
            str(lease.get("owner")),
            str(lease.get("pool_id")),
            str(lease.get("num_blocks")),
            _lease(lease.get("expires_in_s"), 1),
        )
    if len(leases) > max_rows:
        table.add_row("…", Text(f"{len(leases) - max_rows} more", style="dim"), "", "", "")
    return table


def _invariants(invariants: dict[str, Any]) -> Text:
    violations = invariants.get("violations", [])
    if invariants.get("ok") and not violations:
        return Text("✓ invariants ok", style="bold green")
    text = Text(f"✗ {len(violations)} invariant violation(s)", style="bold red")
    for violation in violations:
        text.append(f"\n  • {violation}", style="red")
    return text
