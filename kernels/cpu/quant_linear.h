// The quantized-linear kernel's drivers, one source file each (they compile in parallel):
//   quant_float.cpp  float32 activations: tiles that decode each group inside the dot products, panels
//                    decoded into a scratch buffer for a float32 GEMM, and the embedding's row lookup
//   quant_int8.cpp   int8 activations: integer dot products of codes with quantized rows
//   quant_interleaved.cpp  Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K with 8 output rows interleaved (the byte layouts)
//   int8_interleaved.cpp   the avx2 and avx512 paths' int8 tiles over them
//   quant_linear.cpp the ops (argument checks, which driver a call takes) and their registration
// `type` is a GGML type number quant::supported accepts; `w` row n starts at w + n * w_stride bytes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

#include "lane_sum.h"
#include "quant_formats.h"

QUANT_BEGIN

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
constexpr int64_t kChunks = kGroup / kLanes;  // vectors per group
static_assert(kGroup % kLanes == 0, "a group must be whole vectors");

using lane_sum::sum_lanes;

// Output features per thread at the least: below ~256K weight-rows of work a second thread's
// fork/join (and, on shared cores, its wait) costs more than it saves.
inline int64_t grain(int64_t M, int64_t K) {
  const int64_t work = std::max<int64_t>(1, M) * K;
  return std::max<int64_t>(2, (262144 + work - 1) / work);
}

// How far ahead of the group being decoded a tile asks for its weight row's bytes (prefetchnta: read
// once, kept out of the caches' other levels). A step streams every weight from memory once; the
// hardware prefetcher alone, following a tile's two interleaved rows, left a one-row step at ~8-11
// GB/s of the 26 two cores read (EPYC Zen 3: a Q4_0 1024-wide linear 7.9 -> 13.5 GB/s with it).
#ifndef PAGEDSERVE_PREFETCH_BYTES
#define PAGEDSERVE_PREFETCH_BYTES 1024
#endif
inline void prefetch_ahead(const uint8_t* p) { __builtin_prefetch(p + PAGEDSERVE_PREFETCH_BYTES, 0, 0); }

// out[M, N] = x[M, K] w^T (+ bias), each weight group decoded in registers per tile of rows.
void linear_tiles(int64_t type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride,
                  const float* bias, float* out, int64_t N);

// The same through panels of decoded rows and ATen's float32 GEMM (x: [M, K] contiguous, out: [M, N]).
void linear_panels(int64_t type, const at::Tensor& x, const uint8_t* w, int64_t w_stride, const at::Tensor& bias,
                   at::Tensor& out);

// out[t] = row ids[t] of w decoded (K weights).
void decode_rows(int64_t type, const uint8_t* w, int64_t w_stride, const int64_t* ids, int64_t count, int64_t K,
                 float* out);

// out = x w^T (+ bias) with x quantized to int8 per 32-block; vnni: vpdpbusd (avx512 path only). Integer
// types only (not F16/BF16).
void linear_int8(int64_t type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride,
                 const float* bias, float* out, int64_t N, bool vnni);

// Whether this build's linear_int8 takes `type` two groups per register (the avx2 path's Q4_0 and Q4_1):
// those tiles stay ahead of the panels far longer (quant_linear.cpp's int8_panel_rows).
bool int8_pairs_groups(int64_t type);

// Whether this build's linear_int8 takes `type` a super-block at a time (the avx2 path's Q2_K-Q6_K): those
// tiles stay ahead of the panels to ~96 rows (quant_linear.cpp's int8_panel_rows).
bool int8_superblock_tiles(int64_t type);

// Rows interleaved by 8 (quant_interleaved.cpp; `type` the stored GGML type, Q4_0, Q4_1, Q8_0, Q4_K or
// Q6_K, N a multiple of 8, rows contiguous): out [N, row_bytes] from w's stored rows, and back, rows
// ids[t] -> out[t].
void interleave_rows(int64_t type, const uint8_t* w, int64_t N, int64_t row_bytes, uint8_t* out);
void deinterleave_rows(int64_t type, const uint8_t* w, int64_t row_bytes, const int64_t* ids, int64_t count,
                       uint8_t* out);

// Whether this build runs int8 tiles over the interleaved layouts (the avx2 and avx512 paths); the portable
// path reads them through deinterleave_rows.
bool int8_interleaved();

// out = x w^T (+ bias) over an interleaved layout (`type` Q4_0_R8 ... Q6_K_R8), x quantized to int8; vnni:
// vpdpbusd (avx512 path only).
void linear_interleaved_int8(int64_t type, const float* x, int64_t M, int64_t K, const uint8_t* w, const float* bias,
                             float* out, int64_t N, bool vnni);

QUANT_END
