"""What the driver of `pagedserve up --ray` says about its actors: Ray restarts them, this only
watches and tells, in the local supervisor's words (`child_exited` with the cause and the restart
number, `child_started` with the new pid, `child_given_up`).

A core without I/O: `RayDeployment.check()` feeds it what Ray's actor table and node list say.
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from dataclasses import dataclass
from typing import Any

PENDING_WARN_S = 10.0  # an actor not placed after this long is reported: its resources are missing


@dataclass(frozen=True, slots=True)
class ActorRow:
    """The part of Ray's actor table the watch reads."""

    state: str  # DEPENDENCIES_UNREADY, PENDING_CREATION, ALIVE, RESTARTING, DEAD
    num_restarts: int
    pid: int
    node_id: str


@dataclass(frozen=True, slots=True)
class Event:
    name: str  # child_exited, child_started, child_given_up, child_pending
    fields: dict[str, Any]


@dataclass(slots=True)
class _Seen:
    row: ActorRow | None = None
    alive_on: str = ""  # the node it last ran on: a restart's cause is that node's fate
    started_logged_pid: int = 0
    pending_since: float | None = None
    pending_warned: bool = False


class ActorWatch:
    def __init__(self, names: list[str]) -> None:
        self._seen = {name: _Seen() for name in names}

    def observe(self, name: str, row: ActorRow, alive_nodes: Set[str], now: float) -> Iterator[Event]:
        seen = self._seen[name]
        before, seen.row = seen.row, row
        if before is not None and row.num_restarts > before.num_restarts:
            cause = "node lost" if seen.alive_on not in alive_nodes else "process died"
            # Polls may miss a fast restart in between: each one is a restart, named by its number.
            for number in range(before.num_restarts + 1, row.num_restarts + 1):
                yield Event(
                    "child_exited",
                    {"child": name, "cause": cause, "restart_number": number, "node": short(seen.alive_on)},
                )
        if row.state == "ALIVE":
            seen.alive_on = row.node_id
        if row.state == "ALIVE" and row.pid and row.pid != seen.started_logged_pid:
            seen.started_logged_pid = row.pid
            seen.pending_since, seen.pending_warned = None, False
            yield Event("child_started", {"child": name, "pid": row.pid, "node": short(row.node_id)})
        elif row.state == "DEAD" and (before is None or before.state != "DEAD"):
            yield Event("child_given_up", {"child": name, "restarts": row.num_restarts})
        elif row.state in ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING"):
            seen.pending_since = now if seen.pending_since is None else seen.pending_since
            if not seen.pending_warned and now - seen.pending_since >= PENDING_WARN_S:
                seen.pending_warned = True
                waited = round(now - seen.pending_since, 1)
                yield Event("child_pending", {"child": name, "state": row.state, "waited_s": waited})

    def dead(self) -> list[str]:
        return [
            name for name, seen in self._seen.items() if seen.row is not None and seen.row.state == "DEAD"
        ]


def short(node_id: str) -> str:
    return node_id[:8]
