"""What the driver of `pagedserve up --ray` says about its actors: Ray restarts them, this only
watches and tells, in the local supervisor's words (`child_exited` with the cause and the restart
number, `child_started` with the new pid, `child_given_up`).

A core without I/O: `RayDeployment.check()` feeds it what Ray's actor table and node list say.
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from dataclasses import dataclass, field
from typing import Any

PENDING_WARN_S = 10.0  # an actor not placed after this long is reported: its resources are missing
# Ray's defaults (health check every 3 s, 10 s timeout, 5 misses): a dead node is declared after ~68 s.
DEFAULT_NODE_DEATH_S = 5 * (3.0 + 10.0) + 3.0


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
    # Restarts whose cause is not known yet: (restart number, the node it ran on, seen at).
    unsettled: list[tuple[int, str, float]] = field(default_factory=list)
    pending_since: float | None = None
    pending_warned: bool = False


class ActorWatch:
    """A restart's cause is the fate of the node the actor ran on. Ray restarts an actor as soon as
    its owner sees the process gone, which on a lost machine comes before the cluster declares the
    node dead (after `node_death_s`, Ray's health-check budget): so a restart on a node still alive
    waits until the node is declared dead ("node lost") or that budget passes ("process died")."""

    def __init__(self, names: list[str], node_death_s: float = DEFAULT_NODE_DEATH_S) -> None:
        self._seen = {name: _Seen() for name in names}
        self._node_death_s = node_death_s

    def observe(self, name: str, row: ActorRow, alive_nodes: Set[str], now: float) -> Iterator[Event]:
        seen = self._seen[name]
        before, seen.row = seen.row, row
        if before is not None and row.num_restarts > before.num_restarts:
            # Polls may miss a fast restart in between: each one is a restart, named by its number.
            for number in range(before.num_restarts + 1, row.num_restarts + 1):
                seen.unsettled.append((number, seen.alive_on, now))
        yield from self._settle(name, seen, alive_nodes, now)
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

    def _settle(self, name: str, seen: _Seen, alive_nodes: Set[str], now: float) -> Iterator[Event]:
        given_up = seen.row is not None and seen.row.state == "DEAD"
        while seen.unsettled:
            number, node, since = seen.unsettled[0]
            if node not in alive_nodes:
                cause = "node lost"
            elif given_up or now - since >= self._node_death_s:
                cause = "process died"
            else:
                return  # in order: a later restart waits for an earlier one's cause
            seen.unsettled.pop(0)
            yield Event(
                "child_exited", {"child": name, "cause": cause, "restart_number": number, "node": short(node)}
            )

    def dead(self) -> list[str]:
        return [
            name for name, seen in self._seen.items() if seen.row is not None and seen.row.state == "DEAD"
        ]


def short(node_id: str) -> str:
    return node_id[:8]
