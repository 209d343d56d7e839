"""The chaos injector's slots: a kind that cannot be injected now gives its slot to the next kind of
the round that can, and stays in the round, so refusals do not starve the run of faults."""

from __future__ import annotations

import random
from types import SimpleNamespace

from pagedserve.ops.chaos.faults import FaultInjector


class SlotInjector(FaultInjector):
    """The real slot policy; injection itself replaced by a rule (which kinds are refused now)."""

    def __init__(self, kinds: list[str], refused: set[str]) -> None:
        super().__init__(None, SimpleNamespace(faults=[]), kinds, 1.0, 1.0, random.Random(0), lambda _: None)
        self.refused = refused
        self.injected: list[str] = []

    def _inject(self, kind: str) -> str | None:
        if kind in self.refused:
            return "refused"
        self.injected.append(kind)
        self.watch.faults.append(SimpleNamespace(pause_s=None, at=0.0, target=kind, pid=1))
        return None

    _inject_worker = _inject_service = _inject


def test_a_refused_kind_gives_its_slot_to_another_and_stays_in_the_round():
    inj = SlotInjector(
        ["worker_kill", "scheduler_kill", "block_manager_kill"], refused={"block_manager_kill"}
    )
    for _ in range(2):
        inj._inject_one(0.0)
    assert sorted(inj.injected) == ["scheduler_kill", "worker_kill"]  # two slots, two faults
    assert inj._round == ["block_manager_kill"]
    inj.refused.clear()
    inj._inject_one(0.0)
    assert inj.injected[-1] == "block_manager_kill"  # the refused kind comes first once it can


def test_a_slot_where_nothing_can_be_injected_injects_nothing():
    inj = SlotInjector(["worker_kill", "api_kill"], refused={"worker_kill", "api_kill"})
    inj._inject_one(0.0)
    assert inj.injected == [] and inj.skipped == {"worker_kill": 1, "api_kill": 1}
    assert sorted(inj._round) == ["api_kill", "worker_kill"]
