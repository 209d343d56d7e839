"""Tiny random checkpoints in the forms of Qwen3-Embedding and Qwen3-Reranker, and transformers'
own answers for them (the references the pooling tests compare with).

- Embedding form: the weights saved from `Qwen3Model` (tensor names without `model.`, no LM head),
  a sentence-transformers `modules.json` with `1_Pooling/config.json` (last-token pooling) and a
  `2_Normalize` module, and a tokenizer whose post-processor appends the end-of-text token, as
  Qwen3-Embedding's does.
- Reranker form: a `Qwen3ForCausalLM` whose tokenizer has "yes" and "no" as single tokens, the chat
  markers (`<|im_start|>`, `<|im_end|>`) as special tokens and `<think>`, `</think>` as plain added
  tokens (decoded as text, as Qwen3's are), and a small Qwen-style chat template that honours
  `enable_thinking`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.tiny_models import EOS_ID, tiny_config

SPECIALS = ["<|im_start|>", "<|im_end|>"]
THINK_TAGS = ["<think>", "</think>"]  # added tokens that are not special, as in Qwen3's: decoded as text
WORDS = {"ye": ("y", "e"), "yes": ("ye", "s"), "no": ("n", "o")}


def save_word_tokenizer(folder: Path, append_eos: bool) -> None:
    """The byte tokenizer of tiny_models plus merges that make "yes" and "no" one token each, and
    the chat markers as special tokens; `append_eos`: every encoding ends with </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": EOS_ID}
    for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[char] = 3 + i
    for word in WORDS:
        vocab[word] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=list(WORDS.values())))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    if append_eos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", EOS_ID)]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.add_tokens(THINK_TAGS)
    fast.save_pretrained(folder)


def _random_norms(model: Any, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))


def make_tiny_embedding_model(folder: Path, pooling: str = "lasttoken", seed: int = 0) -> Path:
    """A Qwen3-Embedding-form checkpoint; `pooling`: the 1_Pooling mode (lasttoken, mean_tokens, cls_token)."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = tiny_config("qwen3")
    config.architectures = ["Qwen3ForCausalLM"]  # as Qwen3-Embedding's config.json says
    model = transformers.Qwen3Model(config)
    _random_norms(model, seed)
    model.save_pretrained(folder)
    config_file = folder / "config.json"
    saved = json.loads(config_file.read_text())
    saved["architectures"] = ["Qwen3ForCausalLM"]
    config_file.write_text(json.dumps(saved, indent=2))
    save_word_tokenizer(folder, append_eos=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    modes = (
        "cls_token",
        "mean_tokens",
        "max_tokens",
        "mean_sqrt_len_tokens",
        "weightedmean_tokens",
        "lasttoken",
    )
    pool = {"word_embedding_dimension": config.hidden_size, "include_prompt": True}
    pool |= {f"pooling_mode_{m}": m == pooling for m in modes}
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pool, indent=2))
    (folder / "2_Normalize").mkdir(exist_ok=True)
    return folder


def make_tiny_reranker(folder: Path, seed: int = 0) -> Path:
    """A Qwen3-Reranker-form checkpoint: a causal LM read through its "yes"/"no" logits."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(tiny_config("qwen3"))
    _random_norms(model, seed)
    model.save_pretrained(folder)
    save_word_tokenizer(folder, append_eos=False)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


# ---------------------------------------------------------------- transformers' answers


def reference_embeddings(
    folder: Path, texts: list[str], pooling: str, normalize: bool = True
) -> list[list[float]]:
    """transformers' final hidden states of each text (tokenized with special tokens, as
    sentence-transformers does), pooled `last` / `mean` / `cls`, in float32."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text)["input_ids"]
            hidden = model(torch.tensor([ids])).last_hidden_state[0]
            vector = {"last": hidden[-1], "mean": hidden.mean(dim=0), "cls": hidden[0]}[pooling]
            if normalize:
                vector = torch.nn.functional.normalize(vector, dim=0)
            out.append(vector.tolist())
    return out


def reference_rerank_scores(folder: Path, prompts: list[list[int]]) -> list[float]:
    """Qwen3-Reranker's score of each prompt: softmax over the ("no", "yes") logits at its last
    position, the "yes" share (its model card's recipe)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    scores = []
    with torch.no_grad():
        for ids in prompts:
            last = model(torch.tensor([ids])).logits[0, -1]
            pair = torch.stack([last[no], last[yes]]).log_softmax(dim=0)
            scores.append(math.exp(pair[1].item()))
    return scores


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
