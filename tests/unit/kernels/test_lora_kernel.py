"""The C++ LoRA delta (kernels/cpu/lora.cpp) against the same sums in float64, on every ISA path this
CPU runs: rows of several slots and of the base (-1) in any order, one to three parts of uneven
widths, ranks and input lengths that are not multiples of a vector (the masked tails), and the
refusals. Sums run in another order than a GEMM's, so float32 results agree to ~1e-6 relative.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.kernels.cpu.build import LORA, load_extension


@pytest.fixture(scope="module")
def lora_delta_(isa: str):
    return load_extension(LORA, isa).lora_delta_


def _reference(out, x, a, b, row_slots) -> torch.Tensor:
    """out + each adapter row's (x a^T) b, per part, in float64."""
    expected = out.double()
    for m, slot in enumerate(row_slots.tolist()):
        if slot < 0:
            continue
        column = 0
        for p, stack in enumerate(b):
            width = stack.shape[2]
            xa = x[m].double() @ a[slot, p].double().t()
            expected[m, column : column + width] += xa @ stack[slot].double()
            column += width
    return expected


CASES = st.tuples(
    st.integers(1, 5),  # slots
    st.lists(
        st.one_of(st.integers(1, 40), st.sampled_from([192, 576, 1536])), min_size=1, max_size=3
    ),  # widths
    st.integers(1, 17),  # rank
    st.one_of(st.integers(1, 70), st.sampled_from([576, 1536])),  # in
    st.one_of(st.integers(1, 20), st.integers(60, 80)),  # rows (a slot's many rows split into items)
    st.integers(0, 2**31 - 1),  # seed
)


@pytest.mark.parametrize("stack_dtype", [torch.float32, torch.bfloat16, torch.float16])
@settings(max_examples=40, deadline=None)
@given(case=CASES)
def test_matches_float64_sums(lora_delta_, stack_dtype, case) -> None:
    """Half stacks (--lora-dtype) are widened exactly: the float64 sums of their rounded weights."""
    slots, widths, rank, in_features, rows, seed = case
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(slots, len(widths), rank, in_features, generator=gen).to(stack_dtype)
    b = [torch.randn(slots, rank, width, generator=gen).to(stack_dtype) for width in widths]
    x = torch.randn(rows, in_features, generator=gen)
    out = torch.randn(rows, sum(widths), generator=gen)
    row_slots = torch.randint(-1, slots, (rows,), generator=gen)
    expected = _reference(out, x, a, b, row_slots)
    lora_delta_(out, x, a, b, row_slots)
    scale = expected.abs().max().item() + 1.0
    assert (out.double() - expected).abs().max().item() <= 1e-5 * scale
    base = row_slots < 0
    assert torch.equal(out[base].double(), expected[base])  # base rows untouched, bit for bit


@pytest.mark.parametrize("rank", [16, 7])  # whole blocks of four ranks, and a tail
def test_a_row_gets_the_same_bits_alone_as_with_others(lora_delta_, rank) -> None:
    """Rows that share a slot are summed two at a time (one load of A for both); speculative
    verification compares a row scored among others with the same row alone, so it must not move a bit."""
    gen = torch.Generator().manual_seed(rank)
    a = torch.randn(3, 2, rank, 576, generator=gen)
    b = [torch.randn(3, rank, width, generator=gen) for width in (576, 100)]
    x = torch.randn(9, 576, generator=gen)
    row_slots = torch.tensor([0, 1, 0, 0, 2, -1, 1, 0, 2])
    together = torch.zeros(9, 676)
    torch.set_num_threads(2)
    lora_delta_(together, x, a, b, row_slots)
    for m in range(9):
        alone = torch.zeros(1, 676)
        lora_delta_(alone, x[m : m + 1], a, b, row_slots[m : m + 1])
        assert torch.equal(alone[0], together[m]), m


@pytest.mark.parametrize("stack_dtype", [torch.bfloat16, torch.float16])
def test_half_stacks_give_the_bits_of_their_float32_widening(lora_delta_, stack_dtype) -> None:
    """A half stack is widened as it is loaded and summed in float32 like a float32 one: the same bits
    as the float32 kernel on the widened stacks (tails of in, width and rank included)."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(3, 2, 7, 583, generator=gen).to(stack_dtype)
    b = [torch.randn(3, 7, width, generator=gen).to(stack_dtype) for width in (576, 101)]
    x = torch.randn(11, 583, generator=gen)
    row_slots = torch.tensor([0, 1, 0, 0, 2, -1, 1, 0, 2, 2, 1])
    half = torch.randn(11, 677, generator=gen)
    wide = half.clone()
    torch.set_num_threads(2)
    lora_delta_(half, x, a, b, row_slots)
    lora_delta_(wide, x, a.float(), [t.float() for t in b], row_slots)
    assert torch.equal(half, wide)


def test_row_strides_and_many_threads(lora_delta_) -> None:
    """x and out as views with a row stride past their width (a fused projection's slice), and a
    call big enough to split over threads."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 2, 16, 576, generator=gen)
    b = [torch.randn(4, 16, 1536, generator=gen) for _ in range(2)]
    x = torch.randn(64, 700, generator=gen)[:, :576]
    out = torch.randn(64, 3100, generator=gen)[:, 10:3082]
    row_slots = torch.arange(64) % 5 - 1
    expected = _reference(out, x, a, b, row_slots)
    torch.set_num_threads(2)
    lora_delta_(out, x, a, b, row_slots)
    assert (out.double() - expected).abs().max().item() <= 1e-5 * (expected.abs().max().item() + 1)


def test_refusals_name_what_is_wrong(lora_delta_) -> None:
    a, b = torch.zeros(2, 1, 4, 8), [torch.zeros(2, 4, 6)]
    x, out = torch.zeros(3, 8), torch.zeros(3, 6)
    with pytest.raises(RuntimeError, match="row 1 names slot 2 of 2"):
        lora_delta_(out, x, a, b, torch.tensor([0, 2, -1]))
    with pytest.raises(RuntimeError, match="x must be a float32"):
        lora_delta_(out, x.bfloat16(), a, b, torch.tensor([0, 1, -1]))
    with pytest.raises(RuntimeError, match="widths add up to 6, out has 7"):
        lora_delta_(torch.zeros(3, 7), x, a, b, torch.tensor([0, 1, -1]))
    with pytest.raises(RuntimeError, match="row_slots must be int64"):
        lora_delta_(out, x, a, b, torch.tensor([0, 1, -1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="b must be a bfloat16"):
        lora_delta_(out, x, a.bfloat16(), b, torch.tensor([0, 1, -1]))
    with pytest.raises(RuntimeError, match="a must be float32, bfloat16 or float16"):
        lora_delta_(out, x, a.double(), [t.double() for t in b], torch.tensor([0, 1, -1]))
    assert not out.any()  # a refused call wrote nothing
