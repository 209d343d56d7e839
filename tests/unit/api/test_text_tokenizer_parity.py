"""TextTokenizer (tokenizers + jinja2, what the API process uses) against transformers' own tokenizer
of the same checkpoint: the same token ids, text, token names, chat prompts and streamed text, on
the bundled GGUF, a GGUF written by the test harness, and folders whose tokenizers exercise what
transformers adds (a BOS post-processor, special tokens, WordPiece's space clean-up)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import jinja2
import pytest
from harness.gguf_models import write_gguf
from harness.pooling_models import make_tiny_reranker

from pagedserve.services.checkpoint import load_tokenizer
from pagedserve.services.text_tokenizer import TextTokenizer
from pagedserve.services.worker.weights.bundled import find_bundled_gguf
from pagedserve.shared.completion_text import CompletionText, text_decoder

# Every feature of transformers' template environment a Hub template uses: namespace, loop controls,
# tojson (indent, non-ASCII, sort_keys), raise_exception, dict, {% generation %}, tools, documents,
# the special tokens by name, reasoning_content, content parts, template kwargs.
TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system='') -%}
{%- if tools %}<|im_start|>system
Tools:
{% for tool in tools %}{{ tool | tojson(indent=2) }}
{% endfor %}<|im_end|>
{% endif -%}
{%- for d in documents or [] %}[doc {{ loop.index }}] {{ d.title }}: {{ d.text }}
{% endfor -%}
{%- for message in messages -%}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] -%}
{{ raise_exception('role ' ~ message.role ~ ' is not allowed') }}
{%- endif -%}
{%- if loop.first and message.role == 'system' %}{% set ns.system = message.content %}{% continue %}{% endif -%}
<|im_start|>{{ message.role }}
{% if ns.system %}[{{ ns.system }}] {% set ns.system = '' %}{% endif %}
{%- if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif -%}
{%- if message.content is string %}{{ message.content }}
{%- elif message.content %}{% for part in message.content %}{{ part.text }}{% endfor %}{% endif -%}
{%- for call in message.tool_calls or [] -%}
<tool_call>{{ dict(name=call.function.name, arguments=call.function.arguments) | tojson(sort_keys=true) }}</tool_call>
{%- endfor -%}
{%- if message.role == 'tool' %} (answers {{ message.tool_call_id }}){% endif -%}
{%- if 'name' in message %} by {{ message.name }}{% endif -%}
{%- if message.role == 'assistant' %}{% generation %}{{ eos_token }}{% endgeneration %}{% endif %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}
{%- endif -%}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo d'une ville",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
}
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?", "name": None},
        {"role": "assistant", "content": "4", "tool_calls": None},
        {"role": "user", "content": "héllo 你好 🙂 <|im_end|>"},
    ],
    [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1", "name": "get_weather"},
    ],
    [
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}],
        },
        {"role": "assistant", "content": "thought through", "reasoning_content": "hmm..."},
        {"role": "user", "content": "  spaced  \n\n"},
    ],
]
STRINGS = [
    "",
    " ",
    "hello",
    " yes and no",
    "Hello, world! It's 5 o'clock , isn't it ?",
    "héllo\n\n  <|im_start|>x<|im_end|>",
    "<s>bos</s> in text",
    "tabs\tand\r\nwindows lines",
    "数字 123 4567 89.01",
    "emoji 🙂👍🏽 and ZWJ 👨‍👩‍👧",
    "   leading and trailing   ",
    "do n't ca n't we 're they 've",
]
STOPS = [[], ["."], [" and"], ["<|im_end|>", "\n\n"], ["🙂"]]


def _random_strings(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcxyz ABC .,!?'\n\t0129éüß你好🙂<>|_"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(count)]


def _trained_folder(folder: Path, kind: str) -> Path:
    """A tokenizer with merges trained here: BPE with a BOS post-processor added by transformers
    (add_bos_token), or WordPiece with [CLS]/[SEP] and transformers' space clean-up."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [*STRINGS, *_random_strings(200, seed=1)] * 3
    if kind == "bpe":
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        backend.train_from_iterator(corpus, trainer)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True
        )
        fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    else:
        backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        backend.normalizer = normalizers.BertNormalizer(lowercase=True)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=300, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"]
        )
        backend.train_from_iterator(corpus, trainer)
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            special_tokens=[("[CLS]", backend.token_to_id("[CLS]")), ("[SEP]", backend.token_to_id("[SEP]"))],
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            bos_token="[CLS]",
            eos_token="[SEP]",
            clean_up_tokenization_spaces=True,
        )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["bundled-gguf", "harness-gguf", "bpe", "wordpiece", "reranker"])
def pair(request, tiny_model, tmp_path_factory) -> tuple[TextTokenizer, Any]:
    """(ours, read back from its export as a restarted API reads it; transformers')."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "bundled-gguf":
        source = find_bundled_gguf()
    elif request.param == "harness-gguf":
        # write_gguf rewrites its folder (weights, chat template): a copy, not the session's model.
        folder = Path(shutil.copytree(tiny_model("qwen2"), tmp / "qwen2"))
        source = write_gguf(folder, tmp / "tiny.gguf", "F32")
    elif request.param == "reranker":
        source = make_tiny_reranker(tmp / "reranker")
    else:
        source = _trained_folder(tmp, request.param)
    theirs = load_tokenizer(source)
    TextTokenizer.from_transformers(theirs).write(tmp)
    return TextTokenizer.read(tmp), theirs


def test_the_same_token_ids_text_and_names(pair):
    ours, theirs = pair
    assert len(ours) == len(theirs)
    assert ours.unk_token_id == theirs.unk_token_id
    for text in [*STRINGS, *_random_strings(150)]:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs.encode(text, add_special_tokens=special), (text, special)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    names = theirs.convert_ids_to_tokens(list(range(len(theirs))))
    assert ours.convert_tokens_to_ids([*names, "no-such-token"]) == theirs.convert_tokens_to_ids(
        [*names, "no-such-token"]
    )


def test_every_token_decodes_alike(pair):
    ours, theirs = pair
    for token_id in range(len(theirs)):
        assert ours.decode([token_id]) == theirs.decode([token_id]), token_id


def test_special_tokens_frame_token_ids_as_encode_frames_text(pair):
    ours, theirs = pair
    for text in STRINGS[1:]:
        bare = theirs.encode(text, add_special_tokens=False)
        assert ours.build_inputs_with_special_tokens(bare) == theirs.encode(text, add_special_tokens=True)


def _render(tokenizer: Any, chat: list[dict[str, Any]], **options: Any) -> str:
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer.render_chat(chat, **options)
    return tokenizer.apply_chat_template(chat, tokenize=False, **options)


def _outcome(tokenizer: Any, chat: list[dict[str, Any]], **options: Any) -> tuple[str, str]:
    """The prompt, or the kind of error (a template that cannot take this chat must refuse it alike)."""
    try:
        return "prompt", _render(tokenizer, chat, **options)
    except (jinja2.TemplateError, ValueError, TypeError) as e:
        return "refused", type(e).__name__


@pytest.mark.parametrize(
    "options",
    [
        {"add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"add_generation_prompt": True, "tools": TOOLS},
        {"add_generation_prompt": True, "enable_thinking": False},
        {"add_generation_prompt": True, "documents": [{"title": "A", "text": "alpha"}]},
        {"continue_final_message": True},
    ],
    ids=["generation-prompt", "none", "tools", "kwargs", "documents", "continue"],
)
def test_the_same_chat_prompts(pair, options):
    ours, theirs = pair
    rendered = 0
    for chat in CHATS:
        if options.get("continue_final_message"):
            chat = [*chat, {"role": "assistant", "content": "The answer is"}]
        outcome = _outcome(ours, chat, **options)
        assert outcome == _outcome(theirs, chat, **options), chat
        kind, text = outcome
        if kind == "refused":
            continue
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        rendered += 1
    assert rendered >= 2  # the comparison compared prompts, not only refusals


def test_a_template_refusal_is_refused_alike(pair):
    ours, theirs = pair
    chat = [{"role": "robot", "content": "beep"}]
    assert _outcome(ours, chat) == _outcome(theirs, chat)
    if ours.chat_template == TEMPLATE:  # raise_exception's message reaches the caller
        with pytest.raises(jinja2.TemplateError, match="role robot is not allowed"):
            _render(ours, chat)


def _stream(tokenizer: Any, token_ids: list[int], stop: list[str]) -> tuple[list[str], bool]:
    text = CompletionText(text_decoder(tokenizer), stop=stop)
    deltas, stopped = [], False
    for n in range(1, len(token_ids) + 1):
        stopped = text.add(token_ids[:n])
        deltas.append(text.take_delta(stopped or n == len(token_ids), token_ids[:n]))
        if stopped:
            break
    return deltas, stopped


def test_the_same_streamed_text_and_stops(pair):
    ours, theirs = pair
    specials = sorted(theirs.all_special_ids)
    for text in STRINGS[3:]:
        ids = theirs.encode(text, add_special_tokens=False)
        ids = [*ids[: len(ids) // 2], *specials[:1], *ids[len(ids) // 2 :]]  # a special token mid-stream
        for stop in STOPS:
            assert _stream(ours, ids, stop) == _stream(theirs, ids, stop), (text, stop)
