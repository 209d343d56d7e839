"""Compile every kernel for a real GPU target on a machine without one: `python -m pagedserve.kernels.triton.compile_check`.

The interpreter accepts tiles the compiler rejects (tl.dot dims under 16, non-power-of-two aranges),
so passing interpreter tests says nothing about a GPU. This runs the real launchers on small CPU
tensors with each kernel swapped for a recorder, then compiles what they would launch down to a
cubin with the ptxas bundled in the triton wheel. Must run without TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TypedDict

import torch
import triton
import triton.knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pagedserve.kernels.attention import CAUSAL, AttentionRules
from pagedserve.kernels.triton import decode_attention, prefill_attention, write_kv

_TYPE_NAMES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.int64: "i64",
}

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class _Recorder:
    """Stands in for a JITFunction: `kernel[grid](*args, **constexprs)` records instead of launching."""

    def __init__(self, fn: Any, launches: dict[str, tuple[Any, dict, dict]]) -> None:
        self.fn = fn
        self.launches = launches

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return self._record

    def _record(self, *args: Any, **constexprs: Any) -> None:
        signature: dict[str, str] = {}
        for name, value in zip(self.fn.arg_names, args, strict=False):
            if isinstance(value, torch.Tensor):
                signature[name] = "*" + _TYPE_NAMES[value.dtype]
            elif isinstance(value, float):
                signature[name] = "fp32"
            else:
                signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        for name in constexprs:
            signature[name] = "constexpr"
        key = f"{self.fn.__name__}{sorted(signature.items())}{sorted(constexprs.items())}"
        self.launches[key] = (self.fn, signature, constexprs)


class PagedInputs(TypedDict):
    """The tensor arguments the decode and prefill launchers share (spread into them with **)."""

    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor


def _paged_inputs(
    dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, head_dim: int, page: int
) -> PagedInputs:
    return {
        "query": torch.zeros(tokens, heads, head_dim, dtype=dtype),
        "k_cache": torch.zeros(4, page, kv_heads, head_dim, dtype=dtype),
        "v_cache": torch.zeros(4, page, kv_heads, head_dim, dtype=dtype),
        "block_tables": torch.zeros(2, 4, dtype=torch.int32),
        "seq_lens": torch.zeros(2, dtype=torch.int32),
        "query_start_loc": torch.zeros(3, dtype=torch.int32),
    }


def record_launches(dtypes: list[torch.dtype]) -> dict[str, tuple[Any, dict, dict]]:
    """Drive each launcher over the shapes the backend meets: GQA groups, head dims, pages, split, routing."""
    launches: dict[str, tuple[Any, dict, dict]] = {}
    modules = [(write_kv, "_write_kv_kernel"), (decode_attention, "_decode_kernel")]
    modules += [(decode_attention, "_merge_partitions_kernel"), (prefill_attention, "_prefill_kernel")]
    originals = [(m, n, getattr(m, n)) for m, n in modules]
    try:
        for module, name, fn in originals:
            setattr(module, name, _Recorder(fn, launches))
        req_ids = torch.zeros(1, dtype=torch.int32)
        for dtype in dtypes:
            for kv_heads, head_dim in ((8, 128), (1, 64), (2, 96)):
                key = torch.zeros(3, kv_heads, head_dim, dtype=dtype)
                cache = torch.zeros(4, 16, kv_heads, head_dim, dtype=dtype)
                write_kv.write_kv(key, key, cache, cache, torch.zeros(3, dtype=torch.int64))
            decodes = (
                (1, 128, 16, 1, None),
                (4, 128, 8, 4, req_ids),
                (8, 64, 128, 2, None),
                (6, 80, 32, 1, req_ids),
            )
            # A layer's rules: a window is a runtime bound (no new kernel), a softcap a constexpr branch.
            for rules in (CAUSAL, AttentionRules(window=37, softcap=30.0)):
                for group, head_dim, page, splits, ids in decodes:
                    t = _paged_inputs(dtype, 2, 2 * group, 2, head_dim, page)
                    for block_n in (64, 16):
                        decode_attention.decode_attention(
                            **t,
                            out=t["query"],
                            scale=0.1,
                            max_seq_len=4 * page,
                            req_ids=ids,
                            num_splits=splits,
                            block_n=block_n,
                            rules=rules,
                        )
                for group, head_dim, max_q, ids in (
                    (1, 128, 300, None),
                    (4, 64, 7, req_ids),
                    (8, 96, 40, None),
                ):
                    t = _paged_inputs(dtype, 2, 2 * group, 2, head_dim, 16)
                    for block_n in (64, 32):
                        prefill_attention.prefill_attention(
                            **t,
                            out=t["query"],
                            scale=0.1,
                            max_query_len=max_q,
                            req_ids=ids,
                            block_n=block_n,
                            rules=rules,
                        )
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
    return launches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90], help="CUDA compute capabilities")
    parser.add_argument(
        "--dtype", nargs="+", choices=sorted(_DTYPES), default=sorted(_DTYPES), help="cache/query dtypes"
    )
    args = parser.parse_args(argv)
    if triton.knobs.runtime.interpret:
        print("compile_check: unset TRITON_INTERPRET (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    launches = list(record_launches([_DTYPES[name] for name in args.dtype]).values())
    failures = 0
    for arch in args.arch:
        target = GPUTarget("cuda", arch, 32)
        for fn, signature, constexprs in launches:
            start = time.perf_counter()
            label = f"sm_{arch} {fn.__name__} {constexprs}"
            try:
                triton.compile(ASTSource(fn, signature, constexprs), target=target)
            except Exception as exc:  # report every failing variant, not just the first
                failures += 1
                print(f"FAIL {label}: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
                continue
            print(f"ok   {label} ({time.perf_counter() - start:.1f}s)")
    print(f"compile_check: {len(launches) * len(args.arch) - failures} compiled, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
