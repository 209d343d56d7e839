"""How a tensor-parallel step's inputs are cheapest sent from rank 0 to another rank: one ZeroMQ ipc
message (what the group does, services/worker/tensor_parallel/group.py) against two torch.distributed
gloo broadcasts (the size, then the bytes: a batch's size varies by step). Two processes on this
machine; each way is timed as rounds of (send, the receiver's 1-byte ipc ack), so subtract half an
ipc round trip from the broadcasts' figure.

    python -m pagedserve.ops.microbench.tp_orders [--bytes 4096] [--rounds 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import zmq

REPEATS = 3


def _join(folder: str, rank: int) -> tuple[zmq.Socket, zmq.Socket]:
    """Join the gloo group; -> (the socket this rank sends on, the one it receives on)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    ctx = zmq.Context()
    send, recv = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    recv.bind(f"ipc://{folder}/to-{rank}")
    send.connect(f"ipc://{folder}/to-{1 - rank}")
    dist.barrier()
    return send, recv


def _receiver(folder: str, rounds: int) -> None:
    send, recv = _join(folder, 1)
    for _ in range(REPEATS):
        for _ in range(rounds + 1):  # + the warm-up round
            recv.recv()
            send.send(b"k")
        for _ in range(rounds + 1):
            size = torch.zeros(1, dtype=torch.int64)
            dist.broadcast(size, 0)
            dist.broadcast(torch.empty(int(size), dtype=torch.uint8), 0)
            send.send(b"k")
    dist.destroy_process_group()


def _timed(one_round: Callable[[], None], rounds: int) -> float:
    """Microseconds a round, after one warm-up round (the first ipc message waits for the connection)."""
    one_round()
    started = time.perf_counter()
    for _ in range(rounds):
        one_round()
    return (time.perf_counter() - started) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=4096, help="a step's inputs (a 64-row decode: ~4 KB)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--receiver", default=None, help=argparse.SUPPRESS)  # the other process
    args = parser.parse_args()
    if args.receiver:
        _receiver(args.receiver, args.rounds)
        return
    folder = tempfile.mkdtemp(prefix="tp-orders-")
    other = subprocess.Popen(
        [sys.executable, "-m", __spec__.name, "--rounds", str(args.rounds), "--receiver", folder]
    )
    send, recv = _join(folder, 0)
    payload = os.urandom(args.bytes)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)

    def ipc() -> None:
        send.send(payload)
        recv.recv()

    def broadcasts() -> None:
        dist.broadcast(torch.tensor([args.bytes]), 0)
        dist.broadcast(data, 0)
        recv.recv()

    ipc_us, broadcast_us = [], []
    for _ in range(REPEATS):  # the cores are shared: the best of a few
        ipc_us.append(_timed(ipc, args.rounds))
        broadcast_us.append(_timed(broadcasts, args.rounds))
    other.wait()
    dist.destroy_process_group()
    print(f"{args.bytes} bytes, load average {os.getloadavg()[0]:.2f}, best of {REPEATS}:")
    print(f"  ipc message + ack:          {min(ipc_us):7.0f} us a round")
    print(f"  two gloo broadcasts + ack:  {min(broadcast_us):7.0f} us a round")


if __name__ == "__main__":
    main()
