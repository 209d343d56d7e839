// Activation rows quantized to int8 per group of 32 (llama.cpp's Q8_0 of the activations), shared by
// the int8 drivers (quant_int8.cpp: the GGML layouts; quant_interleaved.cpp: rows interleaved by 8).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>

#include "quant_linear.h"

QUANT_BEGIN

// One group of 32 activations quantized: codes q = round(x * 127 / max|x|) (ties to even), its scale
// max|x| / 127, and the sum of each half's codes.
struct GroupCodes {
  float d;
  int sums[2];
};

inline GroupCodes quantize_group(const float* xs, int8_t* q) {
  Vec amax(0.0f);
  for (int64_t c = 0; c < kChunks; ++c) amax = at::vec::maximum(amax, Vec::loadu(xs + c * kLanes).abs());
  alignas(64) float lanes[kLanes];
  amax.store(lanes);
  float mx = 0.0f;
  for (int64_t i = 0; i < kLanes; ++i) mx = std::max(mx, lanes[i]);
  const float id = mx > 0.0f ? 127.0f / mx : 0.0f;
  alignas(64) float scaled[kGroup];
  for (int64_t c = 0; c < kChunks; ++c) (Vec::loadu(xs + c * kLanes) * Vec(id)).round().store(scaled + c * kLanes);
  GroupCodes out{mx / 127.0f, {0, 0}};
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  // The scalar loop's casts, 8 at a time: the values are whole numbers within +-127 (NaN aside), so the
  // truncating convert and the saturating packs keep them as they are. One by one they took ~3.3 ns an
  // element: ~200 us of a 64-row, 1024-wide call's ~2 ms (one Zen 3 thread).
  __m256i v[4];
  for (int c = 0; c < 4; ++c) v[c] = _mm256_cvttps_epi32(_mm256_load_ps(scaled + 8 * c));
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  // The packs interleave 128-bit lanes: codes 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31, put back in order.
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  for (int h = 0; h < 2; ++h) {
    const __m256i s = _mm256_add_epi32(v[2 * h], v[2 * h + 1]);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    out.sums[h] = _mm_cvtsi128_si32(t);
  }
#else
  for (int64_t i = 0; i < kGroup; ++i) {
    const int v = static_cast<int>(scaled[i]);
    q[i] = static_cast<int8_t>(v);
    out.sums[i / 16] += v;
  }
#endif
  return out;
}

// Every row's groups quantized, the rows shared out among the threads: each(m, g, codes, GroupCodes).
template <typename Each>
void quantize_rows(const float* x, int64_t M, int64_t K, const Each& each) {
  const int64_t G = K / kGroup;
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / K), [&](int64_t begin, int64_t end) {
    alignas(32) int8_t q[kGroup];
    for (int64_t m = begin; m < end; ++m)
      for (int64_t g = 0; g < G; ++g) each(m, g, q, quantize_group(x + m * K + g * kGroup, q));
  });
}

// One tile of `rows` rows (1..Last) at row m; none for 0.
template <int Last, typename Tile>
inline void last_tile(int64_t rows, int64_t m, const Tile& tile) {
  if constexpr (Last > 0) {
    if (rows == Last)
      tile(std::integral_constant<int, Last>{}, m);
    else
      last_tile<Last - 1>(rows, m, tile);
  }
}

// Rows 0..M in tiles: of `Widest` rows (8 or 4) while they last, then of 4, the last 1-3 rows in one
// smaller tile; tile(std::integral_constant<int, rows>, first row).
template <int Widest, typename Tile>
inline void row_tiles(int64_t M, const Tile& tile) {
  int64_t m = 0;
  if constexpr (Widest >= 8)
    for (; m + 8 <= M; m += 8) tile(std::integral_constant<int, 8>{}, m);
  for (; m + 4 <= M; m += 4) tile(std::integral_constant<int, 4>{}, m);
  last_tile<3>(M - m, m, tile);
}

// Rows 0..M in tiles of 4 while more than `Last` rows remain, then the last 1..Last rows in one tile:
// tile(std::integral_constant<int, rows>, first row). For tiles whose decoded weights every row of the
// tile shares, where a second tile over the same weights costs a whole tile again (a speculative verify
// step's 5-7 rows of one request, a handful of requests).
template <int Last, typename Tile>
inline void row_tiles_last(int64_t M, const Tile& tile) {
  int64_t m = 0;
  for (; M - m > Last; m += 4) tile(std::integral_constant<int, 4>{}, m);
  last_tile<Last>(M - m, m, tile);
}

QUANT_END
