"""Which model dtypes this CPU runs at a usable speed, and a clear refusal for the ones it does not.

bfloat16 is fast where the CPU computes it natively (AMX, AVX512-BF16) and still reasonable where
oneDNN's bf16 path runs on AVX-512 BW/VL/DQ. Elsewhere, on an AVX2-only CPU such as an AMD EPYC Zen 3,
torch's bf16 matmul falls back to scalar conversions: measured 1.3 GFLOP/s there against 128.5 in
float32 ([256x576]x[576x1536], 2 threads), about 100x slower. A server asked for bfloat16 there
is refused at start with the reason and the missing CPU feature, rather than loading a model that
crawls (or, with prepacked weights, crashes in oneDNN's reorder and restarts forever). float16 is
held to the same rule with oneDNN's fp16 path. `PAGEDSERVE_CPU_ISA=avx2|portable` counts as hiding
AVX-512: that is how the refusal is tested on a CPU that has it, and how `--emulate-isa` behaves.
"""

from __future__ import annotations

import torch

from pagedserve.kernels.cpu.isa import ISA_ENV, cpu_flags, forced_isa, is_x86

BF16_FEATURES = "amx_bf16 or avx512_bf16 (or avx512bw + avx512vl + avx512dq for oneDNN's bf16 path)"
FP16_FEATURES = "amx_fp16 or avx512_fp16 (or avx512bw + avx512vl + avx512dq for oneDNN's fp16 path)"


class UnsupportedDtype(ValueError):
    """The dtype asked for would run far slower than float32 on this CPU (or not at all)."""


def onednn_supports(dtype: str) -> bool:
    """oneDNN (torch's CPU GEMM for bf16/fp16) has a native path for `dtype` on this CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == "bfloat16":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == "float16":
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return True


def check_cpu_dtype(dtype: str, device: torch.device | str = "cpu") -> None:
    """UnsupportedDtype naming the CPU feature missing where `dtype` is bfloat16 or float16 on a CPU
    that cannot run it natively; nothing for float32, for CUDA, or where the CPU can."""
    if torch.device(device).type != "cpu" or dtype not in ("bfloat16", "float16"):
        return
    features = BF16_FEATURES if dtype == "bfloat16" else FP16_FEATURES
    forced = forced_isa()
    if is_x86() and forced in ("avx2", "portable"):
        raise UnsupportedDtype(
            f"dtype {dtype}: {ISA_ENV}={forced} hides this CPU's AVX-512, and {dtype} needs {features}; "
            "use --dtype float32 (or auto)"
        )
    if not onednn_supports(dtype):
        has = ", ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma")))) or "none"
        raise UnsupportedDtype(
            f"dtype {dtype}: this CPU lacks {features} (its vector flags: {has}); torch's {dtype} "
            "matmul would run ~100x slower than float32 here. Use --dtype float32 (or auto, which picks it)"
        )
