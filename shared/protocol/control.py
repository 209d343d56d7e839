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
    pools_reply   block manager -> scheduler                    seq, pools {id: PoolInfo}, instance

Not the hot path (a few per second), so the bodies keep their field names. msgspec checks each
field's type and limits while it reads (structs.py): a bad one raises ProtocolError naming the
field, and the receiver answers or logs it and goes on. `bool` is never an `int` here.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

Positive = Annotated[int, Meta(ge=1)]
Count = Annotated[int, Meta(ge=0)]


class WorkerAnnouncement(msgspec.Struct):
    """Who a worker is. Sent with every heartbeat, so a restarted peer learns it within one."""

    TYPE: ClassVar[str] = "announcement"

    worker_id: Annotated[str, Meta(min_length=1)]
    incarnation: str  # new on every start: the same name with a new incarnation lost its state
    num_blocks: Positive
    block_size: Positive
    max_model_len: Positive  # the longest context it serves: the scheduler admits no longer request
    model: str = ""
    # How it runs the model, for the operator: dtype, attention backend, the CPU ISA path each C++ op
    # uses ("torch" where it fell back). Read by the scheduler's `/workers` view.
    runtime: dict[str, str] = {}
    # Counts the step socket's TCP connections (Hello only): a new number means the scheduler's
    # route moved to a new connection, and what it sent on the old one may never have arrived.
    connection: Count = 0
    # A pool in a shared-memory segment that outlives the process: the segment's epoch ("" for a
    # private pool, which dies with the worker), and whether the block manager kept this pool's
    # tables when this process registered it (a restart that found the segment intact).
    pool_epoch: str = ""
    pool_continued: bool = False

    @property
    def pool_id(self) -> str:
        return self.worker_id  # one worker, one KV pool


class Hello(WorkerAnnouncement):
    """From the worker's step socket while idle: steps to it arrive only once it has spoken."""

    TYPE: ClassVar[str] = "hello"


class Heartbeat(WorkerAnnouncement):
    TYPE: ClassVar[str] = "heartbeat"


class Register(WorkerAnnouncement):
    """Answered by Registered: the pool exists before the worker takes any step."""

    TYPE: ClassVar[str] = "register"


class Registered(msgspec.Struct):
    TYPE: ClassVar[str] = "registered"

    pool_id: str
    instance: str  # the block manager's; new on every start
    # The registration found this pool (same epoch, same size) and kept its tables and prefix cache.
    continued: bool = False


class Reset(msgspec.Struct):
    """The worker forgets every request's state (the KV tensors stay allocated) and stamps each
    step result from now on with `generation`: the scheduler's fence against replies from before."""

    TYPE: ClassVar[str] = "reset"

    generation: Count = 0


class DumpStacks(msgspec.Struct):
    """A step of this worker is overdue: print every thread's stack into its log. Goes to the
    heartbeat thread's socket, which answers even while the step thread is stuck."""

    TYPE: ClassVar[str] = "dump_stacks"

    step_age_s: float = 0.0


class RenewOwner(msgspec.Struct):
    """Every live lease of `owner` is pushed out by the lease TTL."""

    TYPE: ClassVar[str] = "renew_owner"

    owner: Annotated[str, Meta(min_length=1)]


class Pools(msgspec.Struct):
    """Which pools does the block manager hold? The probe of a scheduler waiting for it to return."""

    TYPE: ClassVar[str] = "pools"

    seq: int


class PoolInfo(msgspec.Struct, array_like=True):
    num_blocks: int
    block_size: int
    incarnation: str  # of the worker that registered it


class PoolsReply(msgspec.Struct):
    TYPE: ClassVar[str] = "pools_reply"

    seq: int
    pools: dict[str, PoolInfo]
    instance: str


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
