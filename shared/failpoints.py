"""Named failpoints: faults a test deployment switches on in one process, free when off.

The pattern of etcd's gofail and TiKV's fail-rs. Production code marks a place with a name:

    if failpoints.fire("worker.drop_execute"):
        continue  # the point said "return": skip what follows

and a process started with `--failpoints "worker.drop_execute=2*off->1*return"` (service commands
only; `Supervisor(failpoints={child: spec})` in tests) runs that action there. With no spec, `fire`
is one dict truthiness test: nothing is parsed, timed or logged.

A spec is `name=action[;name=action...]`; an action is terms chained by `->`, each
`[P%][N*]task[(arg)]`, tried in order: a term with `N*` applies N times, then the next one does;
`P%` makes it apply with that probability (a term that does not apply still counts). After the
last counted term the point is off again. Tasks:

    off          nothing (a placeholder that counts hits: `5*off->return` fires on the 6th)
    return       `fire` returns True: the caller skips its work (drops a message, a reply)
    sleep(ms)    block this thread that long (a slow step, a delayed reply)
    stop         SIGSTOP this process (a hang; whoever SIGCONTs it sees it resume mid-step)
    kill         SIGKILL this process (a crash nothing can catch: mid-step, mid-K/V-write)
    panic(text)  raise FailpointPanic(text) (a crash at that exact place)

Every point a process may fire is declared in POINTS (the docs list them): a spec naming another
fails at start-up, so a typo cannot silently test nothing.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass

import structlog

POINTS = {
    "worker.drop_execute": "the worker reads an Execute and drops it: no step, no reply",
    "worker.delay_reply": "the worker has a step result and waits before sending it",
    "worker.stop_before_result": "the worker has a step result with tokens and SIGSTOPs itself before sending it",
    "worker.kv_write": "a layer's K/V of a step were just written (the next layers' not yet)",
    "worker.prefill_kv_write": "as worker.kv_write, counting only steps that compute part of a prompt",
    "worker.mid_verification": "the worker has scored proposed tokens (speculative decoding) and not yet sampled them",
    "worker.lora_load": "the worker has read and checked a LoRA adapter a step needs and not yet cached or slotted it",
    "worker.rank_forward": "a tensor-parallel rank > 0 has a step's forward to run and has not started it",
}

_TERM = re.compile(
    r"^(?:(?P<pct>\d+(?:\.\d+)?)%)?(?:(?P<count>\d+)\*)?(?P<task>[a-z]+)(?:\((?P<arg>[^)]*)\))?$"
)
_TASKS = {"off", "return", "sleep", "stop", "panic", "kill"}


class FailpointPanic(RuntimeError):
    """Raised where a `panic` failpoint fires."""


@dataclass(slots=True)
class Term:
    task: str
    arg: str = ""
    count: int | None = None  # None: forever
    probability: float = 1.0


class Failpoint:
    def __init__(self, name: str, terms: list[Term]) -> None:
        self.name = name
        self.terms = terms
        self.lock = threading.Lock()
        self.hits = 0

    def next_term(self) -> Term | None:
        """The term this hit runs (None when the chain is used up), counting the hit."""
        with self.lock:
            self.hits += 1
            while self.terms:
                term = self.terms[0]
                if term.count is None:
                    break
                if term.count > 0:
                    term.count -= 1
                    break
                self.terms.pop(0)
            else:
                return None
            if term.probability < 1.0 and random.random() >= term.probability:
                return None
            return term


_points: dict[str, Failpoint] = {}
_spec: str | None = None  # as given to configure


def parse(spec: str) -> dict[str, Failpoint]:
    """A spec as failpoints; ValueError naming the part that is wrong."""
    points: dict[str, Failpoint] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, eq, action = part.partition("=")
        name = name.strip()
        if not eq:
            raise ValueError(f"failpoint {part!r}: expected name=action")
        if name not in POINTS:
            raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(sorted(POINTS))}")
        terms = []
        for raw in action.split("->"):
            m = _TERM.match(raw.strip())
            if m is None or m["task"] not in _TASKS:
                raise ValueError(
                    f"failpoint {name}: bad term {raw.strip()!r} (tasks: {', '.join(sorted(_TASKS))})"
                )
            task, arg = m["task"], m["arg"] or ""
            if task == "sleep" and not re.fullmatch(r"\d+(\.\d+)?", arg):
                raise ValueError(f"failpoint {name}: sleep needs milliseconds, e.g. sleep(500); got {raw!r}")
            pct = float(m["pct"]) if m["pct"] else 100.0
            if not 0.0 <= pct <= 100.0:
                raise ValueError(f"failpoint {name}: probability {pct}% outside 0-100")
            count = int(m["count"]) if m["count"] else None
            terms.append(Term(task, arg, count, pct / 100.0))
        points[name] = Failpoint(name, terms)
    return points


def configure(spec: str | None) -> None:
    """Arm this process's failpoints from a spec (None or "" disarms all)."""
    global _spec
    _points.clear()
    if spec:
        _points.update(parse(spec))
    _spec = spec or None


def spec() -> str | None:
    """The spec this process was armed with: for the processes it starts itself (a worker's other
    tensor-parallel ranks), which count their own hits."""
    return _spec


def armed() -> list[str]:
    return sorted(_points)


def fire(name: str) -> bool:
    """Run the action armed at `name`, if any; True when it says `return` (skip the work)."""
    if not _points:  # the production path: nothing armed
        return False
    point = _points.get(name)
    if point is None:
        return False
    term = point.next_term()
    if term is None or term.task == "off":
        return False
    structlog.get_logger("pagedserve.failpoints").warning(
        "failpoint_fired", failpoint=name, task=term.task, arg=term.arg, hit=point.hits
    )
    if term.task == "sleep":
        time.sleep(float(term.arg) / 1000.0)
    elif term.task == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif term.task == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif term.task == "panic":
        raise FailpointPanic(term.arg or name)
    return term.task == "return"
