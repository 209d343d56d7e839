// A mixture-of-experts layer's routed experts over GGUF-quantized weights, in one op:
//
//   moe_experts(x [T, H] float32, expert_ids [T, k] int64, weights [T, k] float32,
//               gate_up [E * 2I, row_bytes] uint8, int gate_up_type,
//               down [E * H, row_bytes] uint8, int down_type, int num_experts, int mode) -> [T, H] float32
//
// out[t] = sum over j of weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = expert_ids[t, j],
// the k terms added in ascending expert order (the order Hugging Face's reference sums them in).
// Expert e's gate rows are gate_up's rows [e * 2I, e * 2I + I), its up rows the next I, its down rows
// down's [e * H, (e + 1) * H): each a contiguous run of byte rows that the quantized-linear op of this
// library (quant_linear.cpp, through the dispatcher) runs in place.
//
// Why one op: the Python form (services/worker/layers/moe.py) makes ~4 torch calls per expert hit, each
// a Python round trip and a parallel region of its own, for matrices of 0.3-1 MB at decode; a step of
// 16 requests hits ~28 of 32 experts in every layer. Here the (token, expert) pairs are grouped by
// expert (a stable counting sort), and when at least as many experts are hit as there are threads, the
// experts are shared out among the threads, each running its experts' three products one after the
// other (the kernel's own parallel loop runs inline inside a parallel region, and its panels' GEMM on
// one thread); fewer experts than threads run one by one, each product split across the threads as
// usual. Measured on a 1B Qwen3-MoE layer (32 experts of 512, top-4, Q4_0, int8 activations; AMD EPYC
// Zen 3, 2 threads, ops/microbench/moe_ab.py, medians of 15, one run, 2026-12-06): 1 row 0.16 ms against
// 0.31 for the torch-ops form, 16 rows 1.5 against 2.1, 64 rows 4.7 against 6.0, 512 rows 35.7 against
// 37.2. The weighted sum is split across the threads by columns, every column adding its pairs in
// expert order.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include "library.h"

#include <cstdint>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

// This library's quant_linear (another source of the same build, so the same ISA path).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t mode) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(PAGEDSERVE_LIBRARY_NAME "::quant_linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const c10::optional<at::Tensor>&, int64_t)>();
  return op.call(x, w, type, c10::nullopt, mode);
}

// silu(gate) * up per row of gate_up [n, 2I] -> [n, I]: gate / (1 + exp(-gate)), rounded, times up
// (layer_ops.cpp's form).
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  const int64_t n = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({n, I}, gate_up.options());
  const float* src = gate_up.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    const float* gate = src + r * 2 * I;
    const float* up = gate + I;
    float* o = dst + r * I;
    int64_t d = 0;
    const Vec one(1.0f);
    for (; d + Vec::size() <= I; d += Vec::size()) {
      const Vec g = Vec::loadu(gate + d);
      (g / (one + g.neg().exp()) * Vec::loadu(up + d)).store(o + d);
    }
    for (; d < I; ++d) o[d] = gate[d] / (1.0f + std::exp(-gate[d])) * up[d];
  }
  return out;
}

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                       const at::Tensor& gate_up, int64_t gate_up_type, const at::Tensor& down, int64_t down_type,
                       int64_t num_experts, int64_t mode) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "moe_experts: x must be 2-D float32");
  TORCH_CHECK(expert_ids.dim() == 2 && expert_ids.size(0) == x.size(0) && expert_ids.scalar_type() == at::kLong,
              "moe_experts: expert_ids must be int64 [T, k]");
  TORCH_CHECK(weights.sizes() == expert_ids.sizes() && weights.scalar_type() == at::kFloat,
              "moe_experts: weights must be float32 [T, k]");
  TORCH_CHECK(num_experts > 0 && gate_up.size(0) % (2 * num_experts) == 0 && down.size(0) % num_experts == 0,
              "moe_experts: gate_up and down must hold num_experts experts' rows");
  const at::Tensor xc = x.contiguous(), ids = expert_ids.contiguous(), wc = weights.contiguous();
  const int64_t T = xc.size(0), H = xc.size(1), k = ids.size(1), pairs = T * k;
  const int64_t gu_rows = gate_up.size(0) / num_experts, down_rows = down.size(0) / num_experts;
  TORCH_CHECK(down_rows == H, "moe_experts: down has ", down_rows, " rows per expert, x has ", H, " columns");
  at::Tensor out = at::zeros({T, H}, xc.options());
  if (pairs == 0) return out;

  // Group the (token, slot) pairs by expert, tokens ascending within an expert (a stable counting sort).
  const int64_t* id = ids.data_ptr<int64_t>();
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    TORCH_CHECK(id[p] >= 0 && id[p] < num_experts, "moe_experts: expert id ", id[p], " is outside [0, ",
                num_experts, ")");
    ++start[id[p] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) start[e + 1] += start[e];
  std::vector<int64_t> order(pairs), fill(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) order[fill[id[p]]++] = p;
  std::vector<int64_t> hit;
  for (int64_t e = 0; e < num_experts; ++e)
    if (start[e + 1] > start[e]) hit.push_back(e);

  // Each pair's input row, in grouped order.
  at::Tensor rows = at::empty({pairs, H}, xc.options());
  const float* xp = xc.data_ptr<float>();
  float* rp = rows.data_ptr<float>();
  for (int64_t i = 0; i < pairs; ++i) std::memcpy(rp + i * H, xp + (order[i] / k) * H, H * sizeof(float));

  // Each pair's expert output, in grouped order.
  at::Tensor ys = at::empty({pairs, H}, xc.options());
  auto run = [&](int64_t e) {
    const int64_t n = start[e + 1] - start[e];
    const at::Tensor h = quant_linear(rows.narrow(0, start[e], n), gate_up.narrow(0, e * gu_rows, gu_rows),
                                      gate_up_type, mode);
    const at::Tensor y = quant_linear(silu_and_mul(h), down.narrow(0, e * down_rows, down_rows), down_type, mode);
    std::memcpy(ys.data_ptr<float>() + start[e] * H, y.data_ptr<float>(), n * H * sizeof(float));
  };
  const int64_t count = static_cast<int64_t>(hit.size());
  if (count >= at::get_num_threads() && count > 1) {
    // Each thread claims the next expert, the most rows first: a step's experts hold uneven rows (at 16
    // requests 1 to ~8 of 64 pairs), and halves by count left one thread waiting on the other's larger
    // experts. Each expert's outputs go to its own rows of ys, so which thread runs it changes nothing.
    // (The 1B MoE Q4_K_M, AMD EPYC Zen 4, 2 threads, a 16-request decode step, medians of alternated
    // steps: 72.1 -> 65.8 ms quiet, 76.0 -> 73.5 beside two processes spinning 0.2-0.3 ms every 2 ms,
    // with the interleaved tiles' claims; 64 requests within the noise.)
    std::stable_sort(hit.begin(), hit.end(),
                     [&](int64_t a, int64_t b) { return start[a + 1] - start[a] > start[b + 1] - start[b]; });
    std::atomic<int64_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) run(hit[i]);
    });
  } else {
    for (int64_t e : hit) run(e);
  }

  // out[t] += w * y, pairs in grouped (expert-ascending) order, split by columns.
  const float* yp = ys.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, H, std::max<int64_t>(Vec::size(), 65536 / pairs), [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t p = order[i];
      const float w = wp[p];
      float* o = op + (p / k) * H;
      const float* y = yp + i * H;
      for (int64_t c = c0; c < c1; ++c) o[c] += w * y[c];
    }
  });
  return out;
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY_FRAGMENT(m) {
  m.def(
      "moe_experts(Tensor x, Tensor expert_ids, Tensor weights, Tensor gate_up, int gate_up_type, Tensor down, "
      "int down_type, int num_experts, int mode=0) -> Tensor");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("moe_experts", &moe_experts); }
