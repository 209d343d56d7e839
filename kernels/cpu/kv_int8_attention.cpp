// int8 KV attention, the vector item: paged_attention.cpp's fast path (three passes per item, every
// KV head served from one sub-block of up to W tokens, the transposing lane sum that finishes W dot
// products at once) over int8 rows dequantized in registers.
//
// - Scores: each K row is widened to float32 in registers (AVX-512: 16 int8 sign-extended and
//   converted per instruction pair; AVX2: 8) once per sub-block and dotted with up to R query rows
//   of its KV head; the row's scale multiplies the finished dot product (lane t times scale t).
// - Values: each V row is widened once and added to R rows' accumulators, which stay in registers
//   over the sub-block, with the weight times the row's scale.
// - The query stays float32 (bf16 queries widened): the products are the dequantizing reference's
//   up to summation order, so the accuracy policy (docs/kv-int8.md) is the int8 storage's alone.
//   Integer dot products (VNNI: the query quantized to int8 as well) would add a second rounding.
// - The portable build: plain omp-simd loops over each row widened once (as paged_attention.cpp's
//   portable build, whose vec_base Vectorized lost to them).
#include <ATen/cpu/vec/vec.h>

#include <algorithm>

#include "fast_item.h"
#include "kv_int8.h"

namespace kv_int8 {
inline namespace PAGEDSERVE_LIBRARY {
namespace {

using namespace attention_math;

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool kPlainLoops = false;
#else
constexpr bool kPlainLoops = true;
#endif

// W int8 values widened to float32.
inline Vec widen_int8(const int8_t* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return Vec(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
#elif defined(CPU_CAPABILITY_AVX2)
  return Vec(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#else
  alignas(64) float x[W];
  for (int i = 0; i < W; ++i) x[i] = static_cast<float>(p[i]);
  return Vec::loadu(x);
#endif
}

// out[i] lane t = q_i . k_t * scale_t for the sub-block's n (<= W) K rows of one head (`kb` the
// first, rows `stride` bytes apart); lanes from n on are 0. q: R rows of D floats, pre-scaled.
template <int NV, int R>
void score_rows(const float* q, const int8_t* kb, int64_t stride, int64_t n, Vec* out) {
  constexpr int D = NV * W;
  alignas(64) float scales[W] = {};
  for (int64_t t = 0; t < n; ++t) scales[t] = row_scale(kb + t * stride, D);
  if constexpr (kPlainLoops) {
    alignas(64) float s[R][W] = {};
    for (int64_t t = 0; t < n; ++t) {
      alignas(64) float x[D];
      for (int d = 0; d < D; ++d) x[d] = static_cast<float>(kb[t * stride + d]);
      for (int i = 0; i < R; ++i) {
        const float* qi = q + i * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; ++d) dot += qi[d] * x[d];
        s[i][t] = dot * scales[t];
      }
    }
    for (int i = 0; i < R; ++i) out[i] = Vec::loadu(s[i]);
  } else {
    Vec part[R][W];
    for (int t = 0; t < W; ++t) {
      if (t >= n) {
        for (int i = 0; i < R; ++i) part[i][t] = Vec(0.0f);
        continue;
      }
      Vec x[NV];
      for (int v = 0; v < NV; ++v) x[v] = widen_int8(kb + t * stride + v * W);
      for (int i = 0; i < R; ++i) {
        Vec a = Vec::loadu(q + i * D) * x[0];
        for (int v = 1; v < NV; ++v) a = at::vec::fmadd(Vec::loadu(q + i * D + v * W), x[v], a);
        part[i][t] = a;
      }
    }
    const Vec scale = Vec::loadu(scales);
    for (int i = 0; i < R; ++i) out[i] = sum_lanes(part[i]) * scale;
  }
}

template <int NV, int R>
void score_upto(int64_t rb, const float* q, const int8_t* kb, int64_t stride, int64_t n, Vec* out) {
  if constexpr (R > 1) {
    if (rb < R) return score_upto<NV, R - 1>(rb, q, kb, stride, n, out);
  }
  score_rows<NV, R>(q, kb, stride, n, out);
}

// acc rows [R, D] += sum over the sub-block's n V rows of w[i * row_stride + t] * scale_t * v_t.
template <int NV, int R>
void add_values(float* acc, const float* w, int64_t row_stride, const int8_t* vb, int64_t stride, int64_t n) {
  constexpr int D = NV * W;
  if constexpr (kPlainLoops) {
    for (int64_t t = 0; t < n; ++t) {
      const int8_t* v = vb + t * stride;
      const float s = row_scale(v, D);
      alignas(64) float x[D];
      for (int d = 0; d < D; ++d) x[d] = static_cast<float>(v[d]);
      for (int i = 0; i < R; ++i) {
        const float p = w[i * row_stride + t] * s;
        float* a = acc + i * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) a[d] += p * x[d];
      }
    }
  } else {
    Vec a[R][NV];
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < NV; ++v) a[i][v] = Vec::loadu(acc + (i * NV + v) * W);
    for (int64_t t = 0; t < n; ++t) {
      const int8_t* row = vb + t * stride;
      const float s = row_scale(row, D);
      Vec x[NV];
      for (int v = 0; v < NV; ++v) x[v] = widen_int8(row + v * W);
      for (int i = 0; i < R; ++i) {
        const Vec p(w[i * row_stride + t] * s);
        for (int v = 0; v < NV; ++v) a[i][v] = at::vec::fmadd(p, x[v], a[i][v]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < NV; ++v) a[i][v].store(acc + (i * NV + v) * W);
  }
}

template <int NV, int R>
void add_values_upto(int64_t rb, float* acc, const float* w, int64_t row_stride, const int8_t* vb, int64_t stride,
                     int64_t n) {
  if constexpr (R > 1) {
    if (rb < R) return add_values_upto<NV, R - 1>(rb, acc, w, row_stride, vb, stride, n);
  }
  add_values<NV, R>(acc, w, row_stride, vb, stride, n);
}

// One item, three passes (all scores, each row's softmax, the values: fast_item.h), as
// paged_attention.cpp's attend_item_fast. Rows of one KV head are scored in chunks of RB, each K row
// widened once per chunk; a chunk none of whose rows sees a sub-block skips it in both passes.
template <typename T, int NV>
void attend_item_vector(const Item& item, const T* query, int64_t q_stride, const Cache& cache, const int32_t* table,
                        T* out, int64_t num_heads, const Scoring& scoring, std::vector<float>& scratch) {
  constexpr int D = NV * W;
  constexpr int RB = rows_per_chunk<NV>();
  ItemRows<D> rows(item.first_query, item.num_queries, item.first_pos, num_heads, cache.num_kv_heads, scoring,
                   scratch);
  rows.load_queries(query, q_stride);
  const int64_t row_bytes = cache.row_bytes(), token_bytes = cache.token_bytes();
  for_each_sub_block(cache.k, table, cache.block_size, token_bytes, token_bytes, rows.start, rows.context,
                     [&](int64_t base, int64_t n, const int8_t* kb) {
                       rows.for_each_chunk(RB, [&](int64_t h, int64_t r0, int64_t rb) {
                         if (!rows.reads(r0, r0 + rb - 1, base, n)) return;
                         Vec s[RB];
                         score_upto<NV, RB>(rb, rows.q + r0 * D, kb + h * row_bytes, token_bytes, n, s);
                         for (int64_t i = 0; i < rb; ++i) rows.shaped(s[i]).store(rows.weights_at(r0 + i, base), n);
                       });
                     });
  rows.softmax();
  for_each_sub_block(cache.v, table, cache.block_size, token_bytes, token_bytes, rows.start, rows.context,
                     [&](int64_t base, int64_t n, const int8_t* vb) {
                       rows.for_each_chunk(RB, [&](int64_t h, int64_t r0, int64_t rb) {
                         if (!rows.reads(r0, r0 + rb - 1, base, n)) return;  // all weights 0
                         add_values_upto<NV, RB>(rb, rows.acc + r0 * D, rows.weights_at(r0, base), rows.row_stride,
                                                 vb + h * row_bytes, token_bytes, n);
                       });
                     });
  rows.write_out(out, num_heads);
}

template <typename T, int NV = kMaxHeadDim / W>
ItemFn<T> find_vector_item(int64_t head_dim) {
  if (head_dim == NV * W) return attend_item_vector<T, NV>;
  if constexpr (NV > 1) return find_vector_item<T, NV - 1>(head_dim);
  return nullptr;
}

}  // namespace

template <typename T>
ItemFn<T> vector_item(int64_t head_dim) {
  return find_vector_item<T>(head_dim);
}

template ItemFn<float> vector_item<float>(int64_t);
template ItemFn<c10::BFloat16> vector_item<c10::BFloat16>(int64_t);

}  // namespace PAGEDSERVE_LIBRARY
}  // namespace kv_int8
