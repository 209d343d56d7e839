"""A checkpoint folder converted to a GGUF by llama.cpp's own converter (convert_hf_to_gguf.py), as
users get their files: the metadata names, tensor names and q/k row order are llama.cpp's, not ours.

The converter ships with the llama.cpp peer (ops/peers/setup_llamacpp.sh builds llama-cpp-python,
whose source tree vendors llama.cpp with its converter and gguf-py). It runs in a subprocess of this
interpreter (torch, transformers, safetensors) with the vendored gguf-py first on the path, as the
converter itself arranges. One thing is patched: the converter names a BPE tokenizer's pre-tokenizer
by hashing its output on a sample text and refuses hashes it does not know; the tests' byte-level
tokenizer has none of the known ones, so it is written as "default" (plain byte-level BPE). And the
SentencePiece attempt it makes first is answered "no tokenizer.model", as it is for these folders,
so that the sentencepiece package need not be installed.

    python tests/harness/llamacpp_convert.py CONVERTER_DIR FOLDER OUTFILE OUTTYPE
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def find_converter(venv: Path) -> Path | None:
    """The llama.cpp source folder holding convert_hf_to_gguf.py inside the peer's venv, or None."""
    found = sorted(venv.glob("src/*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    return found[-1].parent if found else None


def convert(converter: Path, folder: Path, outfile: Path, outtype: str = "f32") -> Path:
    """Run llama.cpp's converter on `folder` -> `outfile` (outtype: f32, f16, bf16 or q8_0)."""
    argv = [sys.executable, __file__, str(converter), str(folder), str(outfile), outtype]
    # The converter imports its own tree's modules: that tree goes on the subprocess's path.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(converter), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {folder}:\n{done.stderr[-4000:]}")
    return outfile


def _main(converter: str, folder: str, outfile: str, outtype: str) -> None:
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", outfile, "--outtype", outtype]
    import convert_hf_to_gguf  # noqa: PLC0415 (only in the subprocess, from the peer's tree)
    from conversion.base import TextModel  # noqa: PLC0415

    def no_sentencepiece(self) -> None:  # the converter's own answer when tokenizer.model is absent,
        raise FileNotFoundError("no tokenizer.model")  # without importing sentencepiece to find out

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    TextModel._set_vocab_sentencepiece = no_sentencepiece
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    _main(*sys.argv[1:5])
