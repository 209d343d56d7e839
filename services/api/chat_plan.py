"""A chat-shaped request -> what runs: prompt ids, sampling, tool mode, constraint, and how to read the
output. Shared by /v1/chat/completions, /v1/responses and /v1/messages, which all become a
ChatCompletionRequest first (each in its own file), so tools, structured outputs and reasoning behave
the same whichever API a client speaks.

With a reasoning parser, the thinking block is found in the prompt first (reasoning.py): unless the
template closed it already, a constraint (a JSON schema, required or named tool calls) starts after
the output's `</think>`, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.api.chat_template import render_chat_text
from pagedserve.services.api.reasoning import CLOSE, ThinkState, think_state
from pagedserve.services.api.sampling import chat_sampling
from pagedserve.services.api.schemas import ChatCompletionRequest
from pagedserve.services.api.state import APIState
from pagedserve.services.api.structured import Constraint
from pagedserve.services.api.tools import ToolMode, chat_constraint, template_tools, tool_mode
from pagedserve.shared.protocol.frontend import SamplingParams


@dataclass(frozen=True, slots=True)
class ChatPlan:
    token_ids: list[int]
    sampling: SamplingParams
    mode: ToolMode
    constraint: Constraint | None
    reasoning: ThinkState | None  # None: no reasoning parser; else how the prompt left <think>


def plan_chat(state: APIState, body: ChatCompletionRequest) -> ChatPlan:
    card = state.card
    mode = tool_mode(body)
    constraint = chat_constraint(body, mode)
    tools = template_tools(body)
    kwargs = body.chat_template_kwargs
    text = render_chat_text(card, body.messages, body.add_generation_prompt, tools, kwargs)
    tokenizer = card.tokenizer
    assert tokenizer is not None  # render_chat_text refuses a card without one
    token_ids = list(tokenizer.encode(text, add_special_tokens=False))
    reasoning: ThinkState | None = None
    if state.config.reasoning_parser is not None:
        # What the template wrote for the answer's turn: the prompt less the same turns without it.
        before = (
            render_chat_text(card, body.messages, False, tools, kwargs)
            if body.add_generation_prompt
            else text
        )
        reasoning = think_state(text[len(before) :] if text.startswith(before) else text[-64:])
        if constraint is not None and reasoning != "closed":
            marker = list(tokenizer.encode(CLOSE, add_special_tokens=False))
            spec = constraint.spec.model_copy(update={"starts_after": marker})
            constraint = Constraint(spec, constraint.field)
    sampling = chat_sampling(body, len(token_ids), card.max_model_len, constraint)
    return ChatPlan(token_ids, sampling, mode, constraint, reasoning)
