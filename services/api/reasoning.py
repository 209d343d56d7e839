"""`--reasoning-parser`: the model's `<think>...</think>` block apart from its answer.

Where the thinking starts depends on the chat template as much as on the model: Qwen3 writes `<think>`
itself (or, with `enable_thinking=False`, the template closes an empty block in the prompt), while
DeepSeek-R1's template and the Qwen3 thinking-only models open the block in the prompt, so the output
holds only its end. So the prompt is read first (`prompt_think_state`): the turn the template opened
for the answer either leaves a block open, closes one, or says nothing. Then the output is split as it
streams (`ReasoningSplitter`): reasoning up to `</think>`, the answer after it. Whole answers are split
by the same code, so a streamed answer and an unstreamed one always agree.

- qwen3: an output that does not open with `<think>` (and a prompt that left none open) is all answer.
- deepseek_r1: the output is reasoning until `</think>`, whether or not it opened one.
A block never closed (cut by max_tokens) is all reasoning, as in vLLM.

Structured outputs and tool calls apply to the answer: their grammar starts after `</think>`
(StructuredOutputs.starts_after), unless the prompt already closed the block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OPEN, CLOSE = "<think>", "</think>"
ThinkState = Literal["open", "closed", "none"]
PARSERS = ("qwen3", "deepseek_r1")


def think_state(generation_prompt: str) -> ThinkState:
    """The thinking block as the template left it in the answer's turn: still open, closed (thinking
    off), or never mentioned. `generation_prompt`: what the template adds for the new turn."""
    at = generation_prompt.rfind(OPEN)
    if at < 0:
        return "none"
    return "closed" if CLOSE in generation_prompt[at:] else "open"


def _held_back(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass(slots=True)
class ReasoningSplitter:
    parser: str
    prompt_state: ThinkState = "none"
    _pending: str = ""
    _phase: str = "start"  # start (has the output opened a block?), reasoning, answer
    _trim_newlines: bool = False  # just after </think>: the answer's leading newlines are dropped
    opened: bool = False  # the output had a thinking block (it may be empty)

    def __post_init__(self) -> None:
        if self.prompt_state == "closed":
            self._phase = "answer"
        elif self.prompt_state == "open":
            self._phase = "reasoning"
            self.opened = True

    @property
    def in_answer(self) -> bool:
        return self._phase == "answer"

    def feed(self, text: str) -> tuple[str, str]:
        """New output text -> (reasoning, answer) to send now; text that may be part of a tag waits."""
        if self._phase == "answer":
            return "", self._answer(text)
        self._pending += text
        if self._phase == "start":
            head = self._pending.lstrip()
            if head.startswith(OPEN):
                self._pending = head[len(OPEN) :]
                self._phase = "reasoning"
                self.opened = True
            elif OPEN.startswith(head):
                return "", ""  # maybe the start of <think>: wait
            elif self.parser == "deepseek_r1":
                self._phase = "reasoning"
                self.opened = True
            else:
                self._phase = "answer"
                text, self._pending = self._pending, ""
                return "", self._answer(text)
        at = self._pending.find(CLOSE)
        if at >= 0:
            reasoning, rest = self._pending[:at], self._pending[at + len(CLOSE) :]
            self._pending = ""
            self._phase = "answer"
            self._trim_newlines = True
            return reasoning, self._answer(rest)
        keep = _held_back(self._pending, CLOSE)
        reasoning = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return reasoning, ""

    def finish(self) -> tuple[str, str]:
        """The end of the output: what was held back, as what it turned out to be."""
        rest, self._pending = self._pending, ""
        if self._phase == "reasoning":
            return rest, ""
        return "", self._answer(rest)

    def _answer(self, text: str) -> str:
        if self._trim_newlines and text:
            text = text.lstrip("\n")
            self._trim_newlines = not text
        return text


def split_reasoning(parser: str, prompt_state: ThinkState, text: str) -> tuple[str | None, str]:
    """A whole output -> (reasoning or None when there was none, answer)."""
    splitter = ReasoningSplitter(parser, prompt_state)
    reasoning, answer = splitter.feed(text)
    more_reasoning, more_answer = splitter.finish()
    return (reasoning + more_reasoning if splitter.opened else None), answer + more_answer
