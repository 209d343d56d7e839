"""A checkpoint folder converted to a GGUF by llama.cpp's own converter (convert_hf_to_gguf.py), as
users get their files: the metadata names, tensor names and q/k row order are llama.cpp's, not ours.

The converter ships with the llama.cpp peer (ops/peers/setup_llamacpp.sh builds llama-cpp-python,
whose source tree vendors llama.cpp with its converter and gguf-py). It runs in a subprocess of this
interpreter (torch, transformers, safetensors) with the vendored gguf-py first on the path, as the
converter itself arranges. What is patched: the converter names a BPE tokenizer's pre-tokenizer
by hashing its output on a sample text and refuses hashes it does not know; the tests' byte-level
tokenizer has none of the known ones, so it is written as "default" (plain byte-level BPE). And the
SentencePiece attempt it makes first is answered "no tokenizer.model", as it is for these folders,
so that the sentencepiece package need not be installed (Gemma 2 and Phi-3, whose converters know
only SentencePiece, read the byte-level tokenizer as Gemma 3's and Phi-4's do: as GPT-2's).

    python tests/harness/llamacpp_convert.py CONVERTER_DIR FOLDER OUTFILE OUTTYPE [FOLDER OUTFILE OUTTYPE...]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def find_converter(venv: Path) -> Path | None:
    """The llama.cpp source folder holding convert_hf_to_gguf.py inside the peer's venv, or None."""
    found = sorted(venv.glob("src/*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    return found[-1].parent if found else None


def convert(converter: Path, folder: Path, outfile: Path, outtype: str = "f32") -> Path:
    """Run llama.cpp's converter on `folder` -> `outfile` (outtype: f32, f16, bf16 or q8_0)."""
    convert_all(converter, [(folder, outfile, outtype)])
    return outfile


def convert_all(converter: Path, jobs: list[tuple[Path, Path, str]]) -> None:
    """Run the converter on each (folder, outfile, outtype), in one subprocess: its imports (torch,
    transformers) cost more than converting a tiny model, and are paid once."""
    argv = [sys.executable, __file__, str(converter)]
    for folder, outfile, outtype in jobs:
        argv += [str(folder), str(outfile), outtype]
    # The converter imports its own tree's modules: that tree goes on the subprocess's path.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(converter), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        names = ", ".join(str(folder) for folder, _, _ in jobs)
        raise RuntimeError(f"llama.cpp's converter failed on {names}:\n{done.stderr[-4000:]}")


def dequantized_folder(folder: Path, gguf_file: Path, out: Path) -> Path:
    """A copy of checkpoint `folder` at `out` whose weights are `gguf_file`'s where the file stores them
    in another type than F32 (F16 or quantized), dequantized by the `gguf` package: the model that file
    holds, for transformers to run as the reference of a load of that file. The F32 tensors (norms,
    which a Gemma file stores as 1 + w) stay the folder's own. For the architectures whose q/k rows the
    converter keeps in Hugging Face's order (not "llama")."""
    import shutil

    import gguf
    import torch
    from safetensors.torch import load_file, save_file

    from pagedserve.services.worker.weights.gguf_weights import PERMUTED_QK, hf_name

    reader = gguf.GGUFReader(gguf_file)
    arch = str(reader.fields["general.architecture"].contents())
    assert arch not in PERMUTED_QK, arch
    shutil.copytree(folder, out)
    (weights,) = out.glob("*.safetensors")
    state = load_file(weights)
    for tensor in reader.tensors:
        name = hf_name(tensor.name, arch)
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32 or name is None:
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        assert tuple(values.shape) == tuple(state[name].shape), (name, values.shape, state[name].shape)
        state[name] = torch.from_numpy(np.ascontiguousarray(values))
    save_file(state, weights, metadata={"format": "pt"})
    return out


def _main(converter: str, *jobs: str) -> None:
    import convert_hf_to_gguf  # noqa: PLC0415 (only in the subprocess, from the peer's tree)
    from conversion.base import TextModel  # noqa: PLC0415

    def no_sentencepiece(self) -> None:  # the converter's own answer when tokenizer.model is absent,
        raise FileNotFoundError("no tokenizer.model")  # without importing sentencepiece to find out

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    TextModel._set_vocab_sentencepiece = no_sentencepiece
    # Gemma 2's and Phi-3's converters read only a SentencePiece tokenizer.model (Phi-4's GPT-2 one by
    # its tokenizer_config's class): the tests' byte-level BPE goes the GPT-2 way, as Gemma 3's does.
    from conversion.gemma import Gemma2Model  # noqa: PLC0415
    from conversion.phi import Phi3MiniModel  # noqa: PLC0415

    Gemma2Model.set_vocab = Phi3MiniModel.set_vocab = TextModel._set_vocab_gpt2
    for i in range(0, len(jobs), 3):
        folder, outfile, outtype = jobs[i : i + 3]
        sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", outfile, "--outtype", outtype]
        convert_hf_to_gguf.main()


if __name__ == "__main__":
    _main(*sys.argv[1:])
