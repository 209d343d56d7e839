"""Qwen3-Reranker's judging prompt: the query and one document -> the token ids the model reads.

The recipe of its model card: a system turn asking for "yes" or "no", the pair as
`<Instruct>: ...\n<Query>: ...\n<Document>: ...` in the user turn, and an assistant turn whose empty
thinking block is already closed, so the next token is the answer. Prefix, pair and suffix are
tokenized apart and joined (as the card does), and a pair too long for the context loses its end.
The score is then P("yes") against "no" at the last position: sigmoid(logit_yes - logit_no).
"""

from __future__ import annotations

import math
from typing import Any

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def judge_prompt(
    tokenizer: Any, query: str, document: str, instruction: str | None, max_len: int
) -> list[int]:
    pair = f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
    prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(SUFFIX, add_special_tokens=False)
    body = tokenizer.encode(pair, add_special_tokens=False)
    room = max(max_len - len(prefix) - len(suffix), 1)
    return prefix + body[:room] + suffix


def judged_score(no_logit: float, yes_logit: float) -> float:
    """softmax([no, yes])[yes], computed without overflow."""
    diff = no_logit - yes_logit
    if diff > 0:
        e = math.exp(-diff)
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(diff))
