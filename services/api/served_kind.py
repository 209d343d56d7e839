"""What the API serves for this model: generation, embeddings, or cross-encoder scores (`--runner`).

- generate: /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages.
- embed: /v1/embeddings, and /v1/score and /v1/rerank as cosine similarity of embeddings (a bi-encoder).
  Any of our models can be one: its final hidden states pooled (as vLLM's `--convert embed` does).
- rerank: /v1/score and /v1/rerank from a Qwen3-Reranker-style causal LM: the "yes" against "no" logit at
  the end of its judging template (rerank_template.py).

`auto` reads the checkpoint the way sentence-transformers would: a `modules.json` with a Pooling module
makes it an embedding model, pooled as its `1_Pooling/config.json` says and normalised when a Normalize
module follows; anything else is a generation model. A reranker is never guessed: `--runner rerank`.
Asking a model for what it is not served as is a 400 naming the flag that would serve it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedserve.services.api.errors import APIError
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.protocol.pooling import PoolingKind

# sentence-transformers' 1_Pooling modes -> ours (the others, max and weighted mean, are not served).
_POOLING_MODES: dict[str, PoolingKind] = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}
_FLAG = {"generate": "--runner generate", "embed": "--runner embed", "rerank": "--runner rerank"}


@dataclass(frozen=True, slots=True)
class ServedKind:
    runner: str  # generate, embed or rerank
    pooling: PoolingKind = "last"  # embed
    normalize: bool = True  # embed: L2-normalise
    judge_token_ids: tuple[int, int] | None = None  # rerank: the ids of "no" and "yes"

    def require(self, runner: str, what: str, model: str) -> None:
        """A 400 unless this model is served as `runner`."""
        if self.runner == runner or (runner == "score" and self.runner in ("embed", "rerank")):
            return
        wanted = "--runner embed or --runner rerank" if runner == "score" else _FLAG[runner]
        raise APIError(
            400,
            f"model {model!r} is served as a {self.runner} model (--runner {self.runner}); {what} needs a "
            f"server started with {wanted}",
            "model",
            "unsupported_by_model",
        )


def sentence_transformers_pooling(folder: Path) -> tuple[PoolingKind, bool] | None:
    """(pooling, normalize) from a sentence-transformers checkpoint's modules, or None if it has none."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    pooling_module = next((m for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
    if pooling_module is None:
        return None
    pool_config = json.loads((folder / pooling_module.get("path", "1_Pooling") / "config.json").read_text())
    modes: list[PoolingKind] = [ours for key, ours in _POOLING_MODES.items() if pool_config.get(key)]
    others = [
        k for k, v in pool_config.items() if k.startswith("pooling_mode_") and v and k not in _POOLING_MODES
    ]
    if others or len(modes) != 1:
        raise ValueError(
            f"{folder}/1_Pooling/config.json asks for {', '.join(others) or 'several modes at once'}; "
            f"pagedserve pools last, mean or cls (--pooling)"
        )
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    return modes[0], normalize


def served_kind(config: ServeConfig, folder: Path, tokenizer: Any | None) -> ServedKind:
    """The runner, pooling and normalisation for this model, from the flags and its checkpoint."""
    found = sentence_transformers_pooling(folder)
    runner = config.runner
    if runner == "auto":
        runner = "embed" if found is not None else "generate"
    if runner == "rerank":
        return ServedKind("rerank", judge_token_ids=judge_token_ids(tokenizer, folder))
    if runner == "generate":
        return ServedKind("generate")
    pooling, normalize = found if found is not None else ("last", True)
    if config.pooling != "auto":
        pooling = config.pooling
    if config.normalize_embeddings is not None:
        normalize = config.normalize_embeddings
    return ServedKind("embed", pooling, normalize)


def judge_token_ids(tokenizer: Any | None, folder: Path) -> tuple[int, int]:
    """The ids of "no" and "yes", each one token of the vocabulary (as in Qwen3-Reranker's)."""
    if tokenizer is None:
        raise ValueError(f"--runner rerank needs a tokenizer; {folder} has none")
    ids = []
    for word in ("no", "yes"):
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is None or token_id == tokenizer.unk_token_id or tokenizer.decode([token_id]) != word:
            raise ValueError(
                f"--runner rerank reads the logits of the tokens 'yes' and 'no'; {folder}'s tokenizer has "
                f"no single token {word!r} (is this a Qwen3-Reranker-style model?)"
            )
        ids.append(int(token_id))
    return ids[0], ids[1]
