"""`pagedserve top`'s frame, rendered on rich's recording console from a real pool encoding."""

from __future__ import annotations

from rich.console import Console

from pagedserve.ops.cli.top import render_top, sparkline
from pagedserve.services.block_manager.manager import BlockManager


def frame(pool: dict, sched: dict | None = None, width: int = 100) -> Console:
    console = Console(record=True, width=width, color_system="truecolor")
    console.print(render_top(pool, sched, width))
    return console


def test_one_leaked_block_in_ten_thousand_shows_as_a_red_cell():
    manager = BlockManager(lease_ttl_s=1.0)
    manager.add_pool("w0", 10_000, 16)
    manager.allocate("w0", "ghost-0", "ghost", [5] * 8, 8, 0.0)  # one block, its lease lapses at 1.0
    pool = manager.pool_view(2.0) | {
        "history": {"t": [], "used": [], "total": [], "cached": [], "leases": []}
    }
    console = frame(pool)
    text = console.export_text(clear=False)
    assert "pool w0: 1/10000 used" in text and "leaked 1" in text
    assert "one cell = 34 blocks" in text  # 10,000 blocks over 3 rows of 100 cells
    # The cell holding it is drawn in the leaked style, though 33 of its 34 blocks are free.
    assert "\x1b[1;31m█" in console.export_text(styles=True)


def test_broken_invariants_are_shown_with_their_words():
    manager = BlockManager(lease_ttl_s=10.0)
    manager.add_pool("w0", 64, 16)
    a = manager.allocate("w0", "a", "s", [5] * 8, 8, 0.0)
    manager._pools["w0"].blocks[a.block_ids[0]].ref_count = 3  # a bug's footprint, put there by hand
    pool = manager.pool_view(0.0) | {
        "history": {"t": [], "used": [], "total": [], "cached": [], "leases": []}
    }
    text = frame(pool).export_text()
    assert "✗ 1 broken" in text and "ref count disagrees" in text


def test_sparkline_scales_to_the_largest_value():
    assert sparkline([0, 1, 2, 4], 10) == "▁▃▅█"
    assert sparkline([], 10) == ""


def test_top_once_exits_2_when_neither_server_answers(capsys):
    from pagedserve.ops.cli.command import main

    assert (
        main(
            [
                "top",
                "--once",
                "--scheduler-url",
                "http://127.0.0.1:1",
                "--block-manager-url",
                "http://127.0.0.1:1",
            ]
        )
        == 2
    )
    assert "scheduler: http://127.0.0.1:1/view/sched" in capsys.readouterr().out
