// The three-pass work item both vector attention kernels run (paged_attention.cpp's attend_item_fast
// over float K/V, kv_int8_attention.cpp's attend_item_vector over int8 K/V), less what depends on how
// K/V are stored: a tile of queries of one request, every head, as rows ordered by KV head, then query,
// then the query heads sharing the KV head; their scratch; the walk over the context in sub-blocks; the
// softmax pass; the output. Each kernel brings its own score and value passes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_math.h"

namespace attention_math {
inline namespace PAGEDSERVE_LIBRARY {

// Query rows per K/V row read (D = NV * W): R x NV value accumulators in registers with room for the
// row being added (AVX-512: 32 vector registers, the tuned table; AVX2: 16). A decode row's GQA group
// (SmolLM2: 3) fits in one chunk. The portable build's plain loops keep them in memory: its rows share
// each widened V row.
template <int NV>
constexpr int rows_per_chunk() {
#if defined(CPU_CAPABILITY_AVX512)
  return NV <= 4 ? 4 : (NV <= 8 ? 2 : 1);
#elif defined(CPU_CAPABILITY_AVX2)
  return NV <= 2 ? 4 : (NV <= 4 ? 2 : 1);
#else
  return 4;
#endif
}

// One item's rows (head_dim D) and its scratch: acc, the pre-scaled queries, the weights, the sums.
template <int D>
struct ItemRows {
  int64_t first_query, first_pos, group, head_rows, rows, context;
  // The positions some row sees, [start, context): the first query's window starts earliest.
  int64_t start, span;
  // Whole vectors, rounded up: the softmax pass reads and writes them whole. Weight t of a row is
  // position start + t.
  int64_t row_stride;
  Scoring scoring;
  bool capped;
  Vec cap, inv_cap;
  float* acc;      // [rows, D]
  float* q;        // [rows, D] float32, pre-scaled
  float* weights;  // [rows, row_stride]
  float* sums;     // [rows]

  // KV heads [head0, head0 + num_kv_heads) of the layer's (all of them, or a part where a step has
  // fewer items than threads: paged_attention.cpp).
  int64_t head0;

  ItemRows(int64_t first_query, int64_t num_queries, int64_t first_pos, int64_t num_heads, int64_t num_kv_heads,
           const Scoring& scoring, std::vector<float>& scratch, int64_t head0 = 0, int64_t layer_kv_heads = 0)
      : first_query(first_query),
        first_pos(first_pos),
        group(num_heads / (layer_kv_heads > 0 ? layer_kv_heads : num_kv_heads)),
        head_rows(num_queries * group),
        rows(head_rows * num_kv_heads),
        context(first_pos + num_queries),
        start(scoring.first_visible(first_pos)),
        span(context - start),
        row_stride((span + W - 1) / W * W),
        scoring(scoring),
        capped(scoring.softcap > 0.0f),
        cap(scoring.softcap),
        inv_cap(capped ? 1.0f / scoring.softcap : 0.0f),
        head0(head0) {
    scratch.resize(static_cast<size_t>(rows * (2 * D + row_stride + 1) + 16));
    acc = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
    q = acc + rows * D;
    weights = q + rows * D;
    sums = weights + rows * row_stride;
    std::fill(acc, acc + rows * D, 0.0f);
  }

  int64_t token(int64_t r) const { return first_query + (r % head_rows) / group; }
  int64_t head(int64_t r) const { return (head0 + r / head_rows) * group + r % group; }
  int64_t limit(int64_t r) const { return first_pos + (r % head_rows) / group + 1; }  // causal
  int64_t lower(int64_t r) const { return scoring.first_visible(limit(r) - 1); }     // the window
  // Whether any of rows [first, last] sees a position of [base, base + n): limits and windows grow
  // with the row. A row that sees part of it has the lanes outside masked by the softmax pass.
  bool reads(int64_t first, int64_t last, int64_t base, int64_t n) const {
    return base < limit(last) && base + n > lower(first);
  }
  float* weights_at(int64_t r, int64_t base) const { return weights + r * row_stride + (base - start); }
  // A score vector under the layer's softcap.
  Vec shaped(const Vec& s) const { return capped ? cap * tanh_vec(s * inv_cap) : s; }

  template <typename T>
  const T* query_row(const T* query, int64_t q_stride, int64_t r) const {
    return query + token(r) * q_stride + head(r) * D;
  }
  template <typename T>
  void load_queries(const T* query, int64_t q_stride) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = query_row(query, q_stride, r);
      for (int d = 0; d < D; ++d) q[r * D + d] = load(src[d]) * scoring.scale;
    }
  }

  // fn(h, r0, rb) for each chunk of up to `chunk` rows [r0, r0 + rb) of one KV head h.
  template <typename F>
  void for_each_chunk(int64_t chunk, F&& fn) const {
    for (int64_t h = 0; h < rows / head_rows; ++h) {
      for (int64_t r0 = h * head_rows; r0 < (h + 1) * head_rows; r0 += chunk) {
        fn(h, r0, std::min<int64_t>(chunk, (h + 1) * head_rows - r0));
      }
    }
  }

  // Each row's scores -> its softmax weights (0 outside the row's [lower, limit)), and their sum.
  void softmax() {
    const Vec minus_inf(-std::numeric_limits<float>::infinity()), zero(0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float* w = weights + r * row_stride;
      const int64_t lo = lower(r) - start, hi = limit(r) - start;  // the row's weights, [lo, hi)
      // The weights of [t, t + W) inside [lo, hi), `fill` outside: edge vectors are blended, never
      // computed on, since lanes outside the row may hold another row's scores or nothing.
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
  }

  // Each row's accumulator over its sum, into its token's head in `out` [tokens, num_heads, D].
  template <typename T>
  void write_out(T* out, int64_t num_heads) const {
    for (int64_t r = 0; r < rows; ++r) {
      T* dst = out + (token(r) * num_heads + head(r)) * D;
      const float inv = 1.0f / sums[r];
      if constexpr (std::is_same_v<T, float>) {
        for (int v = 0; v < D / W; ++v) (Vec::loadu(acc + r * D + v * W) * Vec(inv)).store(dst + v * W);
      } else {
        for (int d = 0; d < D; ++d) store(dst + d, acc[r * D + d] * inv);
      }
    }
  }
};

// fn(base, n, rows) for the context [start, context) in sub-blocks of up to W tokens that never cross
// a block boundary (`rows`: token base's rows for every head, `token_stride` elements per token).
// A block is one contiguous run, which the hardware prefetcher follows, but the jump to the next
// block (anywhere in the pool) costs a miss: each block's successor is prefetched on entering it.
// Only the `row_elems` elements of each token the item reads are prefetched (from `cache`, already at
// the item's first head): an item of one KV head of four that prefetched whole blocks asked for four
// times its bytes, and one request's decode on two threads ran no faster than on one.
template <typename E, typename F>
inline void for_each_sub_block(const E* cache, const int32_t* table, int64_t block_size, int64_t token_stride,
                               int64_t row_elems, int64_t start, int64_t context, F&& fn) {
  auto block_rows = [&](int64_t pos) {
    return cache + (static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size) * token_stride;
  };
  const int64_t row_bytes = row_elems * static_cast<int64_t>(sizeof(E));
  const int64_t stride_bytes = token_stride * static_cast<int64_t>(sizeof(E));
  for (int64_t base = start, n = 0; base < context; base += n) {
    const int64_t next = (base / block_size + 1) * block_size;
    if ((base == start || base % block_size == 0) && next < context) {
      const char* p = reinterpret_cast<const char*>(block_rows(next));
      const int64_t tokens = std::min(block_size, context - next);
      if (row_elems == token_stride) {  // every head: the block's tokens are one run
        for (int64_t o = 0; o < tokens * stride_bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
      } else {
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + t * stride_bytes + o, 0, 3);
      }
    }
    n = std::min<int64_t>({W, block_size - base % block_size, context - base});
    fn(base, n, block_rows(base));
  }
}

}  // namespace PAGEDSERVE_LIBRARY
}  // namespace attention_math
