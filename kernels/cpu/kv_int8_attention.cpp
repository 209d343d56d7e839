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
#include <limits>
#include <type_traits>

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

// Query rows per K/V row read: R x NV value accumulators in registers with room for the widened row
// (AVX-512: 32 vector registers; AVX2: 16). A decode row's GQA group (SmolLM2: 3) fits in one pass.
template <int NV>
constexpr int rows_per_pass() {
#if defined(CPU_CAPABILITY_AVX512)
  return NV <= 4 ? 4 : (NV <= 8 ? 2 : 1);
#elif defined(CPU_CAPABILITY_AVX2)
  return NV <= 2 ? 4 : (NV <= 4 ? 2 : 1);
#else
  return 4;
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

// The next block's rows (every head) into cache: a block is one contiguous run, which the hardware
// prefetcher follows, but the jump to the next block (anywhere in the pool) costs a miss.
inline void prefetch_block(const int8_t* cache, const Cache& geometry, const int32_t* table, int64_t next_base,
                           int64_t context) {
  if (next_base >= context) return;
  const int64_t tokens = std::min(geometry.block_size, context - next_base);
  const char* p = reinterpret_cast<const char*>(cache + geometry.token_offset(table, next_base));
  for (int64_t o = 0; o < tokens * geometry.token_bytes(); o += 64) __builtin_prefetch(p + o, 0, 3);
}

// One item, three passes (all scores, each row's softmax, the values), rows ordered by KV head, then
// query, then the query heads sharing the KV head (paged_attention.cpp's attend_item_fast).
template <typename T, int NV>
void attend_item_vector(const Item& item, const T* query, int64_t q_stride, const Cache& cache, const int32_t* table,
                        T* out, int64_t num_heads, const Scoring& scoring, std::vector<float>& scratch) {
  constexpr int D = NV * W;
  constexpr int RB = rows_per_pass<NV>();
  const int64_t num_kv_heads = cache.num_kv_heads, block_size = cache.block_size;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t nq = item.num_queries;
  const int64_t head_rows = nq * group;
  const int64_t rows = head_rows * num_kv_heads;
  const int64_t context = item.first_pos + nq;
  const int64_t start = scoring.first_visible(item.first_pos);  // the first query's window starts earliest
  const int64_t span = context - start;
  const int64_t row_bytes = cache.row_bytes(), token_bytes = cache.token_bytes();
  const int64_t row_stride = (span + W - 1) / W * W;  // weight t of a row is position start + t
  scratch.resize(static_cast<size_t>(rows * (2 * D + row_stride + 1) + 16));
  float* acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  float* q = acc + rows * D;                  // [rows, D] float32, pre-scaled
  float* weights = q + rows * D;              // [rows, row_stride]
  float* sums = weights + rows * row_stride;  // [rows]
  std::fill(acc, acc + rows * D, 0.0f);
  auto token = [&](int64_t r) { return item.first_query + (r % head_rows) / group; };
  auto head = [&](int64_t r) { return (r / head_rows) * group + r % group; };
  auto limit = [&](int64_t r) { return item.first_pos + (r % head_rows) / group + 1; };  // causal
  auto lower = [&](int64_t r) { return scoring.first_visible(limit(r) - 1); };         // the window
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = query + token(r) * q_stride + head(r) * D;
    for (int d = 0; d < D; ++d) q[r * D + d] = load(src[d]) * scoring.scale;
  }
  // Sub-blocks: up to W tokens, never across a block boundary.
  auto sub_block = [&](int64_t base, int64_t& n) {
    n = std::min<int64_t>({W, block_size - base % block_size, context - base});
    return cache.token_offset(table, base);
  };
  const bool capped = scoring.softcap > 0.0f;
  const Vec cap(scoring.softcap), inv_cap(capped ? 1.0f / scoring.softcap : 0.0f);
  for (int64_t base = start, n = 0; base < context; base += n) {
    if (base == start || base % block_size == 0) {
      prefetch_block(cache.k, cache, table, (base / block_size + 1) * block_size, context);
    }
    const int8_t* kb = cache.k + sub_block(base, n);
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      for (int64_t r0 = h * head_rows; r0 < (h + 1) * head_rows; r0 += RB) {
        const int64_t rb = std::min<int64_t>(RB, (h + 1) * head_rows - r0);
        // Limits and windows grow with the row: the chunk is skipped when none of its rows sees this
        // sub-block; a row that sees part of it has the lanes outside masked by the softmax pass.
        if (base >= limit(r0 + rb - 1) || base + n <= lower(r0)) continue;
        Vec s[RB];
        score_upto<NV, RB>(rb, q + r0 * D, kb + h * row_bytes, token_bytes, n, s);
        for (int64_t i = 0; i < rb; ++i) {
          if (capped) s[i] = cap * tanh_vec(s[i] * inv_cap);
          s[i].store(weights + (r0 + i) * row_stride + (base - start), n);
        }
      }
    }
  }
  const Vec minus_inf(-std::numeric_limits<float>::infinity()), zero(0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* w = weights + r * row_stride;
    const int64_t lo = lower(r) - start, hi = limit(r) - start;  // the row's weights, [lo, hi)
    // [t, t + W) inside [lo, hi), `fill` outside: lanes outside the row may hold another row's
    // scores or nothing, so edge vectors are blended, never computed on.
    auto inside = [&](int64_t t, const Vec& x, const Vec& fill) {
      if (t >= lo && t + W <= hi) return x;
      const Vec index = Vec::arange(static_cast<float>(t), 1.0f);
      const Vec keep = (index >= Vec(static_cast<float>(lo))) & (index < Vec(static_cast<float>(hi)));
      return Vec::blendv(fill, x, keep);
    };
    Vec vmax = minus_inf;
    for (int64_t t = lo / W * W; t < hi; t += W) vmax = at::vec::maximum(vmax, inside(t, Vec::loadu(w + t), minus_inf));
    const Vec row_max(at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, vmax));
    Vec sum = zero;
    for (int64_t t = 0; t < span; t += W) {  // weights outside the row's own range are 0
      Vec e = zero;
      if (t + W > lo && t < hi) e = inside(t, exp_nonpositive_vec(inside(t, Vec::loadu(w + t), row_max) - row_max), zero);
      e.store(w + t);
      sum = sum + e;
    }
    sums[r] = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum);
  }
  for (int64_t base = start, n = 0; base < context; base += n) {
    if (base == start || base % block_size == 0) {
      prefetch_block(cache.v, cache, table, (base / block_size + 1) * block_size, context);
    }
    const int8_t* vb = cache.v + sub_block(base, n);
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      for (int64_t r0 = h * head_rows; r0 < (h + 1) * head_rows; r0 += RB) {
        const int64_t rb = std::min<int64_t>(RB, (h + 1) * head_rows - r0);
        if (base >= limit(r0 + rb - 1) || base + n <= lower(r0)) continue;  // all weights 0
        add_values_upto<NV, RB>(rb, acc + r0 * D, weights + r0 * row_stride + (base - start), row_stride,
                                vb + h * row_bytes, token_bytes, n);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = out + (token(r) * num_heads + head(r)) * D;
    const float inv = 1.0f / sums[r];
    if constexpr (std::is_same_v<T, float>) {
      for (int v = 0; v < NV; ++v) (Vec::loadu(acc + r * D + v * W) * Vec(inv)).store(dst + v * W);
    } else {
      for (int d = 0; d < D; ++d) store(dst + d, acc[r * D + d] * inv);
    }
  }
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
