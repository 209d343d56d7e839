"""Which prompt prefixes each shard has seen: chained hashes of a prompt's first blocks, and an LRU set
of them per shard.

The router holds no tokenizer, so a text prompt's blocks are runs of characters (about four to a
token); a prompt sent as token ids is cut at the block size itself. The chain makes a block's hash
stand for everything before it, so "the first k hashes are known" means "this shard has seen a prompt
with these k blocks as its start" — what a prefix cache can reuse. What a shard has seen is only an
estimate of what it holds cached (blocks get evicted there, and a router restart forgets it all):
placement is a hint, and a wrong guess costs a recompute, never a wrong answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

CHARS_PER_TOKEN = 4
MAX_BLOCKS = 64  # hashed per prompt: enough to tell shared system prompts apart, bounded per request


def prompt_blocks(prompt: str | Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the prompt's whole leading blocks (at most MAX_BLOCKS)."""
    step = block_size * CHARS_PER_TOKEN if isinstance(prompt, str) else block_size
    hashes: list[int] = []
    previous = 0
    for start in range(0, min(len(prompt) // step, MAX_BLOCKS) * step, step):
        chunk = prompt[start : start + step]
        previous = hash((previous, chunk if isinstance(chunk, str) else tuple(chunk)))
        hashes.append(previous)
    return hashes


class SeenPrefixes:
    """One shard's seen block hashes, least recently used dropped first past `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def matched(self, blocks: Sequence[int]) -> int:
        """How many of `blocks`, from the first, this shard has seen."""
        count = 0
        for h in blocks:
            if h not in self._seen:
                break
            count += 1
        return count

    def add(self, blocks: Sequence[int]) -> None:
        for h in blocks:
            self._seen[h] = None
            self._seen.move_to_end(h)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def clear(self) -> None:
        self._seen.clear()
