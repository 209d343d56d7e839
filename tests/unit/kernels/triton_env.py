"""Import first in every Triton test module: runs the kernels in Triton's CPU interpreter.

TRITON_INTERPRET must be set before our kernel modules are imported (@triton.jit picks interpreter
or compiler when a kernel is defined). A GPU run sets TRITON_INTERPRET=0 to compile for real.
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETING: bool = os.environ["TRITON_INTERPRET"] == "1"
DEVICE: torch.device = torch.device("cuda" if torch.cuda.is_available() and not INTERPRETING else "cpu")


def max_examples(default: int) -> int:
    """Hypothesis examples per property; PAGEDSERVE_TRITON_EXAMPLES overrides (the GPU check trims
    them: compiled for real, every new shape is a fresh compile of a second or more)."""
    return int(os.environ.get("PAGEDSERVE_TRITON_EXAMPLES", default))
