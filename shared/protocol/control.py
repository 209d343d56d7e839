"""Control messages between the services: who is there, who owns what, start over.

    type          from -> to                                    body
    hello         worker (step socket) -> scheduler             WorkerAnnouncement
    heartbeat     worker -> scheduler and block manager         WorkerAnnouncement
    register      worker -> block manager                       WorkerAnnouncement
    registered    block manager -> worker                       pool_id, instance, continued
    reset         scheduler -> worker                           generation
    dump_stacks   scheduler -> worker (heartbeat socket)        step_age_s (a suspected hang: log every stack)
    renew_owner   scheduler -> block manager                    owner
    pools         scheduler -> block manager                    seq
    pools_reply   block manager -> scheduler                    seq, pools {id: [num_blocks, block_size, incarnation]},
                                                                instance

Not the hot path (a few per second), so each is read with its fields checked: a bad one raises
ProtocolError naming the field, and the receiver answers or logs it and goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pagedserve.shared.protocol.codec import ProtocolError


def _field(body: dict[str, Any], name: str, kind: type, of: str) -> Any:
    value = body.get(name)
    # bool is an int to Python, never to the protocol.
    if type(value) is not kind and not (kind is float and type(value) is int):
        raise ProtocolError(
            "bad_fields", f"{of}: field {name!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _count(body: dict[str, Any], name: str, of: str, least: int = 1) -> int:
    value = _field(body, name, int, of)
    if value < least:
        raise ProtocolError("bad_fields", f"{of}: field {name!r} must be >= {least}, got {value}")
    return value


def _str_map(body: dict[str, Any], name: str, of: str) -> dict[str, str]:
    value = body.get(name, {})  # absent from older workers
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ProtocolError("bad_fields", f"{of}: field {name!r} must be a map of strings to strings")
    return value


@dataclass(slots=True)
class WorkerAnnouncement:
    """Who a worker is. Sent with every heartbeat, so a restarted peer learns it within one."""

    TYPE: ClassVar[str] = "announcement"

    worker_id: str
    incarnation: str  # new on every start: the same name with a new incarnation lost its state
    num_blocks: int
    block_size: int
    max_model_len: int  # the longest context it serves: the scheduler admits no longer request
    model: str = ""
    # How it runs the model, for the operator: dtype, attention backend, the CPU ISA path each C++ op
    # uses ("torch" where it fell back). Read by the scheduler's `/workers` view.
    runtime: dict[str, str] = field(default_factory=dict)
    # Counts the step socket's TCP connections (Hello only): a new number means the scheduler's
    # route moved to a new connection, and what it sent on the old one may never have arrived.
    connection: int = 0
    # A pool in a shared-memory segment that outlives the process: the segment's epoch ("" for a
    # private pool, which dies with the worker), and whether the block manager kept this pool's
    # tables when this process registered it (a restart that found the segment intact).
    pool_epoch: str = ""
    pool_continued: bool = False

    @property
    def pool_id(self) -> str:
        return self.worker_id  # one worker, one KV pool

    def to_wire(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "pool_id": self.pool_id,
            "incarnation": self.incarnation,
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "model": self.model,
            "runtime": dict(self.runtime),
            "connection": self.connection,
            "pool_epoch": self.pool_epoch,
            "pool_continued": self.pool_continued,
        }

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> WorkerAnnouncement:
        of = cls.TYPE
        worker_id = _field(body, "worker_id", str, of)
        if body.get("pool_id", worker_id) != worker_id:
            raise ProtocolError("bad_fields", f"{of}: field 'pool_id' must equal 'worker_id'")
        return cls(
            worker_id,
            _field(body, "incarnation", str, of),
            _count(body, "num_blocks", of),
            _count(body, "block_size", of),
            _count(body, "max_model_len", of),
            _field(body, "model", str, of),
            _str_map(body, "runtime", of),
            _count(body, "connection", of, least=0) if "connection" in body else 0,
            _field(body, "pool_epoch", str, of) if "pool_epoch" in body else "",
            _field(body, "pool_continued", bool, of) if "pool_continued" in body else False,
        )


@dataclass(slots=True)
class Hello(WorkerAnnouncement):
    """From the worker's step socket while idle: steps to it arrive only once it has spoken."""

    TYPE: ClassVar[str] = "hello"


@dataclass(slots=True)
class Heartbeat(WorkerAnnouncement):
    TYPE: ClassVar[str] = "heartbeat"


@dataclass(slots=True)
class Register(WorkerAnnouncement):
    """Answered by Registered: the pool exists before the worker takes any step."""

    TYPE: ClassVar[str] = "register"


@dataclass(slots=True)
class Registered:
    TYPE: ClassVar[str] = "registered"

    pool_id: str
    instance: str  # the block manager's; new on every start
    # The registration found this pool (same epoch, same size) and kept its tables and prefix cache.
    continued: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"pool_id": self.pool_id, "instance": self.instance, "continued": self.continued}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Registered:
        return cls(
            _field(body, "pool_id", str, cls.TYPE),
            _field(body, "instance", str, cls.TYPE),
            _field(body, "continued", bool, cls.TYPE) if "continued" in body else False,
        )


@dataclass(slots=True)
class Reset:
    """The worker forgets every request's state (the KV tensors stay allocated) and stamps each
    step result from now on with `generation`: the scheduler's fence against replies from before."""

    TYPE: ClassVar[str] = "reset"

    generation: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"generation": self.generation}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Reset:
        return cls(int(body.get("generation", 0)))


@dataclass(slots=True)
class DumpStacks:
    """A step of this worker is overdue: print every thread's stack into its log. Goes to the
    heartbeat thread's socket, which answers even while the step thread is stuck."""

    TYPE: ClassVar[str] = "dump_stacks"

    step_age_s: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"step_age_s": self.step_age_s}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> DumpStacks:
        return cls(float(body.get("step_age_s", 0.0)))


@dataclass(slots=True)
class RenewOwner:
    """Every live lease of `owner` is pushed out by the lease TTL."""

    TYPE: ClassVar[str] = "renew_owner"

    owner: str

    def to_wire(self) -> dict[str, Any]:
        return {"owner": self.owner}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> RenewOwner:
        return cls(_field(body, "owner", str, cls.TYPE))


@dataclass(slots=True)
class Pools:
    """Which pools does the block manager hold? The probe of a scheduler waiting for it to return."""

    TYPE: ClassVar[str] = "pools"

    seq: int

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Pools:
        return cls(_field(body, "seq", int, cls.TYPE))


@dataclass(slots=True)
class PoolInfo:
    num_blocks: int
    block_size: int
    incarnation: str  # of the worker that registered it


@dataclass(slots=True)
class PoolsReply:
    TYPE: ClassVar[str] = "pools_reply"

    seq: int
    pools: dict[str, PoolInfo]
    instance: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "pools": {pid: [p.num_blocks, p.block_size, p.incarnation] for pid, p in self.pools.items()},
            "instance": self.instance,
        }

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> PoolsReply:
        of = cls.TYPE
        pools: dict[str, PoolInfo] = {}
        for pid, info in _field(body, "pools", dict, of).items():
            if type(info) is not list or len(info) != 3:
                raise ProtocolError(
                    "bad_fields", f"{of}: pool {pid!r} must be [num_blocks, block_size, incarnation]"
                )
            pools[str(pid)] = PoolInfo(int(info[0]), int(info[1]), str(info[2]))
        return cls(_field(body, "seq", int, of), pools, _field(body, "instance", str, of))


CONTROL_MESSAGES: tuple[type, ...] = (
    Hello,
    Heartbeat,
    Register,
    Registered,
    Reset,
    DumpStacks,
    RenewOwner,
    Pools,
    PoolsReply,
)
