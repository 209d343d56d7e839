// A step's LoRA deltas for one linear, every row under its own adapter slot, in one call:
//
//   pagedserve_lora::lora_delta_(out, x, a, b, row_slots) -> ()
//     out[m, part p's columns] += (x[m] . a[s, p]^T) . b[p][s]   for every row m with s = row_slots[m] >= 0
//
// a [slots, parts, R, in] and b[p] [slots, R, out of part p] are LoRALinear's stacks (each part's A,
// and its B transposed and already scaled, zero past the part's rank); the parts' columns follow one
// another in out, in order (q, k, v of a fused q/k/v). Rows of the base model (-1) are not touched.
//
// Why a kernel: at decode sizes (a few rows over a few adapters) torch's GEMMs cost more in calls
// and small-matrix overheads than the work (3-4 calls a linear, 210 linears a step on SmolLM2), and
// the masked form multiplies every row by every slot. Here the rows are grouped by slot, so each
// slot's A and B stream from memory once a call however many of its rows the step holds, and
// nothing is multiplied by a slot the row does not use (punica's BGMV, on CPU cores):
//   shrink  one item per (slot in use, part, up to kShrinkRows of its rows): the slot's R rows of A
//           against each of those rows of x (dot products of length in, two rows at a time so each
//           vector of A is loaded once), into xa [rows, parts, R] in float32;
//   expand  one item per (slot in use, part, kColumns of its output, up to kExpandRows of its rows):
//           R rows of the slot's B over those columns stay in L1 while each of those rows adds its
//           xa-weighted sum of them to out, in vector registers. Items own disjoint parts of out, so
//           they never write the same bytes; a static schedule in blocks gives each thread
//           consecutive columns of one slot's B, which it reads as R forward streams.
// Both in one OpenMP region (a barrier between them), so a call wakes the threads once. The row
// limits matter to a prefill's many rows of one adapter, otherwise one shrink item a part.
// Every row is summed in the same order whichever rows share its slot and call (speculative
// verification compares a row scored with others to the same row alone).
//
// The stacks come from memory every step (at rank 16, ~18 MB per adapter on SmolLM2, against ~96 MB
// of quantized base weights), so the layout of the work is about streaming: on an EPYC Zen 3 (2
// threads, 8 rows over 4 adapters, SmolLM2's four linears cold) items that spanned every slot's B
// per column chunk and a shrink that re-read A per row ran at 238 us a layer; this form at 185.
// Software prefetch (1 KB ahead in A, the next chunk of B) measured no faster.
//
// Activations and out are float32 (float32 models; other dtypes take LoRALinear's torch path). The
// stacks are float32, or bfloat16 / float16 (--lora-dtype): those are widened to float32 as they are
// loaded (exactly), and every sum stays float32, so a half stack gives the float32 result of its
// rounded weights while the step streams half the bytes. Sums run in a different order from torch's
// GEMMs: the result differs from them in the last bits, not more (tests/unit/kernels/test_lora_kernel.py
// holds it to 1e-5 relative).
//
// One source, three ISA paths (kernels/cpu/isa.py): at::vec::Vectorized<float> is 16 lanes on
// avx512, 8 on avx2, and its generic form on portable.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include "lane_sum.h"
#include "library.h"
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
// Output columns per expand item: at R 16, 8 KB of B, which stays in L1 across the slot's rows (64 to
// 512 measured the same).
constexpr int64_t kColumns = 128;
// Rows of one slot an expand item takes at most: a prefill's rows of one adapter split over the threads
// too, where its columns alone make too few items to share evenly (576 columns: 5 items).
constexpr int64_t kExpandRows = 32;
// Below this many multiply-adds a call runs on one thread: waking the second costs more.
constexpr int64_t kWorkPerThread = 1 << 16;

using lane_sum::sum_lanes;

// A vector of float lanes from the stacks' elements: float32 as it is, bfloat16 / float16 widened.
template <typename W>
inline Vec load_lanes(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return Vec::loadu(p);
  } else {
    Vec v;
    if constexpr (std::is_same_v<W, c10::BFloat16>)
      at::vec::load_fp32_from_bf16(p, v);
    else
      at::vec::load_fp32_from_fp16(p, v);
    return v;
  }
}

// The first `count` lanes (< kLanes) from p, the rest 0.
template <typename W>
inline Vec load_lanes(const W* p, int64_t count) {
  if constexpr (std::is_same_v<W, float>) {
    return Vec::loadu(p, count);
  } else {
    W lanes[kLanes] = {};
    std::copy(p, p + count, lanes);
    return load_lanes(lanes);
  }
}

// Up to kRanks dot products of each of kRows rows of x with kRanks rows of A (stride `in`) at once:
// independent accumulators, so the multiply-adds do not wait on one another's latency; each x vector
// is loaded once, and each vector of A once for all kRows rows (the rows of one slot share its A).
// Every row's sums run in the same order whatever kRows is.
constexpr int64_t kRanks = 4;

template <int kRows, typename W>
void dots(const float* const* x, const W* a, int64_t in, int64_t ranks, float* const* result) {
  Vec acc[kRows][kRanks];
  for (int i = 0; i < kRows; ++i)
    for (int64_t r = 0; r < kRanks; ++r) acc[i][r] = Vec(0.f);
  int64_t d = 0;
  for (; d + kLanes <= in; d += kLanes) {
    Vec xv[kRows];
    for (int i = 0; i < kRows; ++i) xv[i] = Vec::loadu(x[i] + d);
    for (int64_t r = 0; r < ranks; ++r) {
      const Vec av = load_lanes(a + r * in + d);
      for (int i = 0; i < kRows; ++i) acc[i][r] = at::vec::fmadd(xv[i], av, acc[i][r]);
    }
  }
  if (d < in) {  // the tail: lanes past it load 0
    Vec xv[kRows];
    for (int i = 0; i < kRows; ++i) xv[i] = Vec::loadu(x[i] + d, in - d);
    for (int64_t r = 0; r < ranks; ++r) {
      const Vec av = load_lanes(a + r * in + d, in - d);
      for (int i = 0; i < kRows; ++i) acc[i][r] = at::vec::fmadd(xv[i], av, acc[i][r]);
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int64_t r = 0; r < ranks; ++r) result[i][r] = sum_lanes(acc[i][r]);
}

template <typename W>
struct Stacks {
  int64_t parts, rank, in;
  const W* a;                       // [slots, parts, R, in]
  std::vector<const W*> b;          // per part, [slots, R, width]
  std::vector<int64_t> width;       // per part: its output columns
  std::vector<int64_t> first;       // per part: its first column in out
};

// Rows of one slot scored together by dots: two, so each vector of A is loaded once for both.
constexpr int kPair = 2;

// Rows of one slot a shrink item takes at most: a prefill's hundreds of rows of one adapter split
// over the threads (A, 36 KB a part at R 16 and 576 in, is read again per item from L2).
constexpr int64_t kShrinkRows = 16;

// The slot's R rows of A for part p against `n` of its rows of x -> xa[row, p, :].
template <typename W>
void shrink(const Stacks<W>& s, int64_t slot, int64_t p, const int64_t* rows, int64_t n, const float* x,
            int64_t x_stride, float* xa) {
  const W* a = s.a + (slot * s.parts + p) * s.rank * s.in;
  auto out_of = [&](int64_t m, int64_t r) { return xa + (m * s.parts + p) * s.rank + r; };
  for (int64_t r = 0; r < s.rank; r += kRanks) {
    const int64_t ranks = std::min(kRanks, s.rank - r);
    int64_t i = 0;
    for (; i + kPair <= n; i += kPair) {
      const float* xs[kPair] = {x + rows[i] * x_stride, x + rows[i + 1] * x_stride};
      float* results[kPair] = {out_of(rows[i], r), out_of(rows[i + 1], r)};
      dots<kPair>(xs, a + r * s.in, s.in, ranks, results);
    }
    if (i < n) {
      const float* xs[1] = {x + rows[i] * x_stride};
      float* results[1] = {out_of(rows[i], r)};
      dots<1>(xs, a + r * s.in, s.in, ranks, results);
    }
  }
}

// Output vectors one expand pass keeps in registers: each its own chain of R multiply-adds.
constexpr int64_t kVectors = 4;

// out[m, part p's columns c0..c1) += sum_r xa[m, p, r] * b[p][slot, r, c] for `n` of the slot's rows.
// (Rows in pairs sharing each vector of B, as the shrink pairs them, measured no faster: 8 to 1024 rows.)
template <typename W>
void expand(const Stacks<W>& s, int64_t slot, int64_t p, int64_t c0, int64_t c1, const int64_t* rows, int64_t n,
            const float* xa, float* out, int64_t out_stride) {
  const int64_t width = s.width[p];
  const W* b = s.b[p] + slot * s.rank * width;
  for (const int64_t* row = rows; row < rows + n; ++row) {
    const int64_t m = *row;
    const float* w = xa + (m * s.parts + p) * s.rank;
    float* o = out + m * out_stride + s.first[p];
    int64_t c = c0;
    for (; c + kVectors * kLanes <= c1; c += kVectors * kLanes) {
      Vec acc[kVectors];
      for (int64_t v = 0; v < kVectors; ++v) acc[v] = Vec::loadu(o + c + v * kLanes);
      for (int64_t r = 0; r < s.rank; ++r) {
        const Vec wr(w[r]);
        const W* b_row = b + r * width + c;
        for (int64_t v = 0; v < kVectors; ++v) acc[v] = at::vec::fmadd(wr, load_lanes(b_row + v * kLanes), acc[v]);
      }
      for (int64_t v = 0; v < kVectors; ++v) acc[v].store(o + c + v * kLanes);
    }
    for (; c < c1; c += kLanes) {  // the last vectors, one at a time (a masked tail at most)
      const int tail = static_cast<int>(std::min(kLanes, c1 - c));
      Vec acc = Vec::loadu(o + c, tail);
      for (int64_t r = 0; r < s.rank; ++r) acc = at::vec::fmadd(Vec(w[r]), load_lanes(b + r * width + c, tail), acc);
      acc.store(o + c, tail);
    }
  }
}

const char* dtype_name(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
}

void check(const at::Tensor& t, const char* name, at::ScalarType dtype = at::kFloat) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype, "lora_delta_: ", name, " must be a ",
              dtype_name(dtype), " CPU tensor, got ", t.scalar_type(), " on ", t.device());
}

template <typename W>
void delta(at::Tensor& out, const at::Tensor& x, const at::Tensor& a, at::TensorList b, const at::Tensor& row_slots);

void lora_delta_(at::Tensor& out, const at::Tensor& x, const at::Tensor& a, at::TensorList b,
                 const at::Tensor& row_slots) {
  check(out, "out");
  check(x, "x");
  TORCH_CHECK(a.device().is_cpu(), "lora_delta_: a must be a CPU tensor, got ", a.device());
  switch (a.scalar_type()) {
    case at::kFloat: return delta<float>(out, x, a, b, row_slots);
    case at::kBFloat16: return delta<c10::BFloat16>(out, x, a, b, row_slots);
    case at::kHalf: return delta<c10::Half>(out, x, a, b, row_slots);
    default: TORCH_CHECK(false, "lora_delta_: a must be float32, bfloat16 or float16, got ", a.scalar_type());
  }
}

template <typename W>
void delta(at::Tensor& out, const at::Tensor& x, const at::Tensor& a, at::TensorList b, const at::Tensor& row_slots) {
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && x.size(0) == out.size(0), "lora_delta_: x [rows, in] and out ",
              "[rows, out] must have the same rows, got ", x.sizes(), " and ", out.sizes());
  TORCH_CHECK(x.stride(1) == 1 && out.stride(1) == 1, "lora_delta_: x's and out's rows must be contiguous");
  TORCH_CHECK(a.dim() == 4 && a.is_contiguous() && a.size(3) == x.size(1), "lora_delta_: a must be contiguous ",
              "[slots, parts, R, ", x.size(1), "], got ", a.sizes());
  TORCH_CHECK(static_cast<int64_t>(b.size()) == a.size(1), "lora_delta_: ", a.size(1), " parts in a, ", b.size(),
              " B stacks");
  TORCH_CHECK(row_slots.dim() == 1 && row_slots.size(0) == x.size(0) && row_slots.scalar_type() == at::kLong &&
                  row_slots.is_contiguous(),
              "lora_delta_: row_slots must be int64 [", x.size(0), "], got ", row_slots.sizes());
  const int64_t slots = a.size(0), rows = x.size(0);
  Stacks<W> s{a.size(1), a.size(2), a.size(3), a.data_ptr<W>(), {}, {}, {}};
  int64_t column = 0;
  for (const at::Tensor& part : b) {
    check(part, "b", a.scalar_type());  // the same dtype as a
    TORCH_CHECK(part.dim() == 3 && part.is_contiguous() && part.size(0) == slots && part.size(1) == s.rank,
                "lora_delta_: each B stack must be contiguous [", slots, ", ", s.rank, ", width], got ", part.sizes());
    s.b.push_back(part.data_ptr<W>());
    s.width.push_back(part.size(2));
    s.first.push_back(column);
    column += part.size(2);
  }
  TORCH_CHECK(column == out.size(1), "lora_delta_: the parts' widths add up to ", column, ", out has ", out.size(1),
              " columns");

  // The rows of each slot in use, in the order slots first appear.
  const int64_t* slot_of = row_slots.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> rows_of(slots);
  std::vector<int64_t> used;
  for (int64_t m = 0; m < rows; ++m) {
    const int64_t slot = slot_of[m];
    if (slot < 0) continue;
    TORCH_CHECK(slot < slots, "lora_delta_: row ", m, " names slot ", slot, " of ", slots);
    if (rows_of[slot].empty()) used.push_back(slot);
    rows_of[slot].push_back(m);
  }
  if (used.empty()) return;

  struct ExpandItem {
    int64_t slot, part, c0, first, count;  // columns [c0, c0 + kColumns) of rows_of[slot][first, + count)
  };
  std::vector<ExpandItem> expands;
  for (int64_t slot : used) {
    const int64_t n = static_cast<int64_t>(rows_of[slot].size());
    for (int64_t p = 0; p < s.parts; ++p)
      for (int64_t c = 0; c < s.width[p]; c += kColumns)
        for (int64_t first = 0; first < n; first += kExpandRows)
          expands.push_back({slot, p, c, first, std::min(kExpandRows, n - first)});
  }
  struct ShrinkItem {
    int64_t slot, part, first, count;  // rows_of[slot][first, first + count)
  };
  std::vector<ShrinkItem> shrinks;
  for (int64_t slot : used) {
    const int64_t n = static_cast<int64_t>(rows_of[slot].size());
    for (int64_t p = 0; p < s.parts; ++p)
      for (int64_t first = 0; first < n; first += kShrinkRows)
        shrinks.push_back({slot, p, first, std::min(kShrinkRows, n - first)});
  }
  const int64_t shrink_items = static_cast<int64_t>(shrinks.size());
  const int64_t expand_items = static_cast<int64_t>(expands.size());
  int64_t adapter_rows = 0;
  for (int64_t slot : used) adapter_rows += static_cast<int64_t>(rows_of[slot].size());
  const int64_t work = adapter_rows * s.rank * (s.in * s.parts + column);
  const int threads = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({at::get_num_threads(), work / kWorkPerThread, expand_items})));

  std::vector<float> xa(rows * s.parts * s.rank);
  const float* xs = x.data_ptr<float>();
  float* os = out.data_ptr<float>();
  const int64_t x_stride = x.stride(0), out_stride = out.stride(0);
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t item = 0; item < shrink_items; ++item) {
      const ShrinkItem& it = shrinks[item];
      shrink(s, it.slot, it.part, rows_of[it.slot].data() + it.first, it.count, xs, x_stride, xa.data());
    }
    // (the implicit barrier: every xa is written before any expand reads it)
#pragma omp for schedule(static)
    for (int64_t item = 0; item < expand_items; ++item) {
      const ExpandItem& it = expands[item];
      const int64_t c1 = std::min(it.c0 + kColumns, s.width[it.part]);
      expand(s, it.slot, it.part, it.c0, c1, rows_of[it.slot].data() + it.first, it.count, xa.data(), os,
             out_stride);
    }
  }
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def("lora_delta_(Tensor(a!) out, Tensor x, Tensor a, Tensor[] b, Tensor row_slots) -> ()");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("lora_delta_", &lora_delta_); }
