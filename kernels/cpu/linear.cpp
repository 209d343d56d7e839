// float32 linears for the few rows of a decode step: y = x W^T (+ b), x [M, K], W [N, K] row-major.
//
//   <library>::linear_rows(x, weight, bias?) -> y [M, N]
//
// With a handful of rows a linear is a read of its weight: each weight row is streamed once and
// dotted with every input row while it sits in registers, so the step costs about its weight bytes
// over the memory bandwidth. A general GEMM (MKL's sgemm, oneDNN) packs and blocks for the square
// case instead; on an AVX2 machine that left the small-batch step several times slower than its
// weight bytes allow (docs/cpu-performance.md has the figures). Work is split over N, in contiguous
// ranges, one per thread of torch's OpenMP pool.
//
// One source for every ISA path: at::vec::Vectorized<float> is 16 lanes with AVX-512, 8 with AVX2
// and a plain array the compiler vectorises on the portable path. A tile of kRows input rows by
// kCols weight rows keeps kRows * kCols accumulators in registers (AVX2 has 16 vector registers,
// AVX-512 32), reduced across lanes once per output. Sums run in another order than a GEMM's, so
// outputs may differ from F.linear's by float32 rounding (~1e-6 relative).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "library.h"

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kRows = 4;
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kCols = 4;  // 16 accumulators + 4 weight vectors + 1 input of 32 registers
#else
constexpr int64_t kCols = 2;  // 8 accumulators + 2 weight vectors + 1 input of 16 registers
#endif

// y[m][n0 + j] for m < MR, j < NC: one pass over NC weight rows, each vector of them used MR times.
template <int64_t MR, int64_t NC>
void tile(const float* x, int64_t x_stride, const float* w, int64_t K, const float* bias, float* y,
          int64_t y_stride, int64_t n0) {
  Vec acc[MR][NC];
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < NC; ++j) acc[i][j] = Vec(0.0f);
  const int64_t body = K - K % Vec::size();
  for (int64_t k = 0; k < body; k += Vec::size()) {
    Vec wv[NC];
    for (int64_t j = 0; j < NC; ++j) wv[j] = Vec::loadu(w + (n0 + j) * K + k);
    for (int64_t i = 0; i < MR; ++i) {
      const Vec xv = Vec::loadu(x + i * x_stride + k);
      for (int64_t j = 0; j < NC; ++j) acc[i][j] = at::vec::fmadd(xv, wv[j], acc[i][j]);
    }
  }
  for (int64_t i = 0; i < MR; ++i) {
    for (int64_t j = 0; j < NC; ++j) {
      float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc[i][j]);
      for (int64_t k = body; k < K; ++k) sum += x[i * x_stride + k] * w[(n0 + j) * K + k];
      y[i * y_stride + n0 + j] = bias == nullptr ? sum : sum + bias[n0 + j];
    }
  }
}

template <int64_t NC>
void rows_tile(int64_t rows, const float* x, int64_t x_stride, const float* w, int64_t K, const float* bias,
               float* y, int64_t y_stride, int64_t n0) {
  switch (rows) {
    case 1: return tile<1, NC>(x, x_stride, w, K, bias, y, y_stride, n0);
    case 2: return tile<2, NC>(x, x_stride, w, K, bias, y, y_stride, n0);
    case 3: return tile<3, NC>(x, x_stride, w, K, bias, y, y_stride, n0);
    default: return tile<kRows, NC>(x, x_stride, w, K, bias, y, y_stride, n0);
  }
}

// Columns [n_begin, n_end) of every row: row tiles inside column tiles, so a weight tile (kCols rows
// of K floats, a few KB) is read from memory once and from L1 for the other row tiles.
void columns(const float* x, int64_t M, int64_t x_stride, const float* w, int64_t K, const float* bias, float* y,
             int64_t N, int64_t n_begin, int64_t n_end) {
  int64_t n = n_begin;
  for (; n + kCols <= n_end; n += kCols)
    for (int64_t m = 0; m < M; m += kRows)
      rows_tile<kCols>(std::min(kRows, M - m), x + m * x_stride, x_stride, w, K, bias, y + m * N, N, n);
  for (; n < n_end; ++n)
    for (int64_t m = 0; m < M; m += kRows)
      rows_tile<1>(std::min(kRows, M - m), x + m * x_stride, x_stride, w, K, bias, y + m * N, N, n);
}

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x [M, K] and weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "linear_rows is float32");
  TORCH_CHECK(x.stride(1) == 1 && weight.is_contiguous(), "x rows and weight must be contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N, "bias [N]");
    b = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t x_stride = x.stride(0);
  // Whole column tiles per task; below ~256 KB of weight a second thread costs more than it saves.
  const int64_t tiles = (N + kCols - 1) / kCols;
  const int64_t grain = std::max<int64_t>(1, (256 * 1024 / 4) / std::max<int64_t>(1, K * kCols));
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    columns(xp, M, x_stride, wp, K, b, yp, N, begin * kCols, std::min(N, end * kCols));
  });
  return y;
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) { m.def("linear_rows(Tensor x, Tensor weight, Tensor? bias) -> Tensor"); }

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("linear_rows", &linear_rows); }
