// Paged attention on the CPU, reading K/V in place from the block-paged cache (no gathered copies).
//
// One op, paged_attention, for every packed query of a step (decode rows, prefill rows, continued
// chunks): query i of request b sits at position seq_len - q_len + i and attends causally to context
// positions <= that, read block by block through block_tables[b]. Plus write_kv, the step's K/V rows
// into their slots.
//
// Per call (one layer), two more rules (Scoring): `window` > 0 keeps only the `window` latest positions
// of each query (a sliding-window layer of Gemma 2/3 or Mistral: exact, the earlier ones are masked,
// and blocks wholly before a query tile's window are not read at all), and `softcap` > 0 bends every
// scaled score s into softcap * tanh(s / softcap) before the softmax (Gemma 2's attention logits).
// 0 and 0 is plain causal attention, the same code and cost as before the two existed.
//
// One source, built three times (kernels/cpu/isa.py, each build its own torch.ops namespace):
// avx512, avx2 and portable (no ISA flag: SSE2 on x86-64, NEON on ARM64). The vector code is written
// over ATen's at::vec::Vectorized<float>, whose width W follows the build: 16 lanes on avx512, 8 on
// avx2, 8 on x86's portable build (vec_base: arrays the compiler vectorises), 4 on NEON.
// The caches hold the query's dtype (float32 or bfloat16), or bfloat16 under float32 queries: a float32
// model's K/V kept in half the bytes (kv_cache_dtype bfloat16), widened as it is read; write_kv rounds
// the float32 rows into it.
// Two algorithms, one result (float32 accumulation whatever the cache dtype; GQA folded into rows:
// the query heads sharing a KV head are rows served by the same K/V vector read, never repeated):
// - fast (head_dim a multiple of W up to 128): all KV heads of a query tile in one work item, three
//   passes per item (scores, softmax, values; see attend_item_fast). It was written for AVX-512 in
//   intrinsics and tuned there; over Vectorized it keeps that structure, and keeps path-specific
//   code only where it paid: the transposing lane sum that finishes W dot products at once (AVX-512
//   and AVX2 shuffles), bf16 widened by a shift, scalef in the AVX-512 exp, AVX512-BF16 dot products
//   for bf16 scores (where the CPU has them), and on the portable build plain omp-simd loops for the
//   dot products and the value sums (vec_base's Vectorized lost to them there).
// - generic (any head_dim): work item = (request, KV head, tile of up to kQueryTile queries), online
//   softmax (running max and sum per row, rescaled per block), loops written so g++ -O3 vectorises
//   them (omp simd reductions, an exp with no libm call, bf16 widened by a shift). paged_attention
//   runs it for the head dims the fast path does not take; paged_attention_generic runs it for any,
//   so the tests hold it to torch on every path and the microbenchmark sets it beside the fast one.
//
// Measured (ops/microbench/attention_kernel_ab, one layer of SmolLM2-135M: 9 query / 3 KV heads,
// head_dim 64, block 16, one thread, best of 30, decode contexts uniform 16-512):
// AMD EPYC (Zen 3; AVX2, FMA, F16C, no AVX-512), 2 cores shared with other builds, in ms per layer:
//                        avx2  portable  generic(avx2)  old generic: avx2  portable   torch
//   decode  8  float32   0.78      0.91           0.83               0.90      1.12    2.87
//   decode  8  bfloat16  0.43      0.62           0.64               0.62      0.88    2.06
//   decode 32  float32   3.33      5.58           7.55               9.72     11.27   11.25
//   decode 32  bfloat16  2.17      3.43           4.58               4.38      5.70    8.96
//   decode 64  float32   5.51      9.90           9.76              16.06     19.22   18.57
//   decode 64  bfloat16  4.72      8.38           9.44               8.62     12.05   15.48
//   prefill 8x30-256 f32 8.73     27.63          20.85              26.02     34.16   12.78
//   prefill 8x30-256 bf16 10.91   25.21          19.80              20.33     33.46   13.08
// ("old generic": the file before this form, whose avx2 and portable builds ran only the generic
// algorithm; "generic(avx2)": that same algorithm in this build. Timings on the shared cores move by
// up to 1.5x between runs; the variants alternate, so a row's ratios hold better than its values.)
// The avx2 fast path is 1.2-2.9x the old avx2 build in decode (more at the larger batches) and
// 2-3x in prefill, 3-5x the torch backend in decode and 1.2-1.5x in prefill. On the portable build
// the fast path (its plain-loop form) is 1.2-2.0x the old portable build. The avx512 build is only
// compiled here, not run: the intrinsics it replaces measured ~2x the generic algorithm at batch 64
// decode on a 2-core Sapphire Rapids, reading K/V at about one core's memory bandwidth (~8 GB/s).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif
#include <omp.h>
#include "fast_item.h"
#include "paged_step.h"
#include "library.h"
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace attention_math;

// A block's K or V rows as float32 with their row stride: float caches are read in place, bf16 ones
// are widened once per block into `buffer`, not once per (row, token) pair in the inner loops.
inline const float* as_float(const float* src, int64_t, int64_t stride, int64_t, float*, int64_t& out_stride) {
  out_stride = stride;
  return src;
}
inline const float* as_float(const c10::BFloat16* src, int64_t n, int64_t stride, int64_t D, float* buffer,
                             int64_t& out_stride) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* row = bits + t * stride;
    uint32_t* dst = reinterpret_cast<uint32_t*>(buffer + t * D);
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<uint32_t>(row[d]) << 16;
  }
  out_stride = D;
  return buffer;
}

struct Item {
  int64_t request;
  int64_t kv_head;  // the generic path's head; a fast item's first
  int64_t kv_count;  // KV heads a fast item serves (every one, or a part: see split_heads)
  int64_t first_query;  // index into the packed query of this tile's first token
  int64_t num_queries;
  int64_t first_pos;  // context position of that first query
  int64_t cost;       // rows x positions read, to hand out the long items first
};

template <typename Q, typename C>
void attend_item(const Item& item, const Q* query, int64_t q_stride, const C* k_cache, const C* v_cache,
                 const int32_t* table, Q* out, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 int64_t block_size, const Scoring& scoring, std::vector<float>& scratch) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t rows = item.num_queries * group;
  const int64_t D = head_dim;
  scratch.resize(static_cast<size_t>(rows * (2 * D + block_size + 4) + 2 * block_size * D));
  float* q = scratch.data();      // [rows, D], pre-scaled
  float* acc = q + rows * D;      // [rows, D]
  float* s = acc + rows * D;      // [rows, block_size]
  float* m = s + rows * block_size;
  float* l = m + rows;
  // The positions each row may read, [lower, limit) (causal, then the window), as floats for the simd loops.
  float* limit = l + rows;
  float* lower = limit + rows;
  float* k_buffer = lower + rows;  // [block_size, D], used for bf16 caches only
  float* v_buffer = k_buffer + block_size * D;
  for (int64_t i = 0; i < item.num_queries; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = i * group + g;
      const Q* src = query + (item.first_query + i) * q_stride + (item.kv_head * group + g) * D;
      for (int64_t d = 0; d < D; ++d) q[r * D + d] = load(src[d]) * scoring.scale;
      limit[r] = static_cast<float>(item.first_pos + i + 1);
      lower[r] = static_cast<float>(scoring.first_visible(item.first_pos + i));
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
    }
  }
  std::fill(acc, acc + rows * D, 0.0f);
  const int64_t context = item.first_pos + item.num_queries;  // the last query's context length
  const int64_t num_blocks = (context + block_size - 1) / block_size;
  const int64_t token_stride = num_kv_heads * D;
  // Blocks wholly before the first query's window are never read.
  for (int64_t j = scoring.first_visible(item.first_pos) / block_size; j < num_blocks; ++j) {
    const int64_t base = j * block_size;
    const int64_t n = std::min(block_size, context - base);
    const int64_t block = table[j];
    int64_t k_stride = 0, v_stride = 0;
    const float* kb =
        as_float(k_cache + (block * block_size * num_kv_heads + item.kv_head) * D, n, token_stride, D,
                 k_buffer, k_stride);
    // Scores: each K vector once, against every row that may see it.
    for (int64_t t = 0; t < n; ++t) {
      const float* k = kb + t * k_stride;
      for (int64_t r = 0; r < rows; ++r) {
        if (base + t >= static_cast<int64_t>(limit[r]) || base + t < static_cast<int64_t>(lower[r])) continue;
        const float* qr = q + r * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * k[d];
        s[r * block_size + t] = scoring.shape(dot);
      }
    }
    // Online softmax over each row's visible run of this block, [first, valid): rescale what the row
    // has so far to the new running max.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t first = std::max<int64_t>(0, static_cast<int64_t>(lower[r]) - base);
      const int64_t valid = std::min<int64_t>(n, static_cast<int64_t>(limit[r]) - base);
      float* sr = s + r * block_size;
      if (valid <= first) {
        std::fill(sr, sr + n, 0.0f);
        continue;
      }
      float block_max = sr[first];
      for (int64_t t = first + 1; t < valid; ++t) block_max = std::max(block_max, sr[t]);
      const float new_max = std::max(m[r], block_max);
      const float alpha = exp_nonpositive(m[r] - new_max);  // 0 on the first block: m is -inf
      const float sum = exp_sum(sr, first, valid, new_max);
      for (int64_t t = 0; t < first; ++t) sr[t] = 0.0f;
      for (int64_t t = valid; t < n; ++t) sr[t] = 0.0f;
      l[r] = l[r] * alpha + sum;
      m[r] = new_max;
      if (alpha != 1.0f) {
        float* ar = acc + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
      }
    }
    // Weighted values: each V vector once, into every row's accumulator.
    const float* vb =
        as_float(v_cache + (block * block_size * num_kv_heads + item.kv_head) * D, n, token_stride, D,
                 v_buffer, v_stride);
    for (int64_t t = 0; t < n; ++t) {
      const float* v = vb + t * v_stride;
      for (int64_t r = 0; r < rows; ++r) {
        const float p = s[r * block_size + t];
        if (p == 0.0f) continue;
        float* ar = acc + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ar[d] += p * v[d];
      }
    }
  }
  for (int64_t i = 0; i < item.num_queries; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = i * group + g;
      Q* dst = out + ((item.first_query + i) * num_heads + item.kv_head * group + g) * D;
      const float inv = 1.0f / l[r];
      for (int64_t d = 0; d < D; ++d) store(dst + d, acc[r * D + d] * inv);
    }
  }
}


// ---- The fast path: ATen's Vectorized<float>, W lanes wide (attention_math.h). head_dim = NV * W,
// NV <= 128 / W.

// Scores of one query row against the sub-block's n (<= W) keys: lane t = q . k_t (scaled); lanes
// from n on are 0 and are masked by the caller. `q` is the row in float32, pre-scaled.
template <int NV>
inline Vec row_scores(const float* q, const float*, const float* kb, int64_t stride, int64_t n, float) {
#if !defined(CPU_CAPABILITY_AVX512) && !defined(CPU_CAPABILITY_AVX2)
  // Portable: one omp-simd dot product per key, which g++ vectorises better than vec_base's arrays.
  alignas(64) float s[W] = {};
  for (int64_t t = 0; t < n; ++t) {
    const float* k = kb + t * stride;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < NV * W; ++d) dot += q[d] * k[d];
    s[t] = dot;
  }
  return Vec::loadu(s);
#endif
  Vec part[W];
  for (int t = 0; t < W; ++t) part[t] = Vec(0.0f);
  if (n == W) {
    // A whole sub-block: W independent sums advance together. Token by token, each token's NV
    // products formed one dependent chain (the FMA's latency, not its throughput, set the pace). The
    // same products in the same order per token: the same sums.
    for (int v = 0; v < NV; ++v) {
      const Vec qv = Vec::loadu(q + v * W);
      for (int t = 0; t < W; ++t) part[t] = at::vec::fmadd(qv, Vec::loadu(kb + t * stride + v * W), part[t]);
    }
    return sum_lanes(part);
  }
  for (int t = 0; t < n; ++t) {
    const float* k = kb + t * stride;
    for (int v = 0; v < NV; ++v) part[t] = at::vec::fmadd(Vec::loadu(q + v * W), Vec::loadu(k + v * W), part[t]);
  }
  return sum_lanes(part);
}

// bf16 keys: with AVX512-BF16, an even NV and bf16 queries, the row's own bf16 values (`qraw`) go
// straight into pairwise bf16 dot products (exact products, float32 sums) and the scale is applied to
// the sums; otherwise (float32 queries too: a float32 model's bf16 K/V) keys are widened to float32
// and the float32 path runs.
template <int NV, typename Q>
inline Vec row_scores(const float* q, const Q* qraw, const c10::BFloat16* kb, int64_t stride, int64_t n,
                      float scale) {
  Vec part[W];
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  if constexpr (NV % 2 == 0 && std::is_same_v<Q, c10::BFloat16>) {
    __m512bh qv[NV / 2];
    for (int v = 0; v < NV / 2; ++v) qv[v] = (__m512bh)_mm512_loadu_si512(qraw + v * 32);
    for (int t = 0; t < W; ++t) {
      __m512 acc = _mm512_setzero_ps();
      if (t < n) {
        const c10::BFloat16* k = kb + t * stride;
        for (int v = 0; v < NV / 2; ++v) acc = _mm512_dpbf16_ps(acc, qv[v], (__m512bh)_mm512_loadu_si512(k + v * 32));
      }
      part[t] = Vec(acc);
    }
    return sum_lanes(part) * Vec(scale);
  }
#endif
  (void)qraw;
  (void)scale;
#if !defined(CPU_CAPABILITY_AVX512) && !defined(CPU_CAPABILITY_AVX2)
  alignas(64) float s[W] = {};
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(kb + t * stride);
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < NV * W; ++d) {
      const uint32_t bits = static_cast<uint32_t>(k[d]) << 16;
      float kf;
      std::memcpy(&kf, &bits, sizeof(kf));
      dot += q[d] * kf;
    }
    s[t] = dot;
  }
  return Vec::loadu(s);
#endif
  for (int t = 0; t < W; ++t) {
    part[t] = Vec(0.0f);
    if (t >= n) continue;
    const c10::BFloat16* k = kb + t * stride;
    for (int v = 0; v < NV; ++v) part[t] = at::vec::fmadd(Vec::loadu(q + v * W), load_vec(k + v * W), part[t]);
  }
  return sum_lanes(part);
}

// acc rows [R, D] in memory += sum over the sub-block's n tokens of w[i * row_stride + t] * v_t,
// through registers: R is a template argument so the row loops unroll and the accumulators stay in
// registers for the sub-block (with a runtime row count g++ kept them on the stack). bf16 values are
// widened to float32 and the weights stay float32: pairs of tokens through AVX512-BF16 dot products
// (weights rounded to bf16) measured no faster and moved outputs by up to 1.6e-2.
template <typename T, int NV, int R>
void add_values_rows(float* acc, const float* w, int64_t row_stride, const T* vb, int64_t stride, int64_t n) {
#if !defined(CPU_CAPABILITY_AVX512) && !defined(CPU_CAPABILITY_AVX2)
  // Portable: each V row widened once, then an omp-simd multiply-add per row (measured faster here
  // than vec_base Vectorized accumulators: 1.1-1.7x in prefill, 1.0-1.25x at batch 64 decode).
  constexpr int D = NV * W;
  for (int64_t t = 0; t < n; ++t) {
    alignas(64) float x[D];
    for (int d = 0; d < D; ++d) x[d] = load(vb[t * stride + d]);
    for (int i = 0; i < R; ++i) {
      const float p = w[i * row_stride + t];
      float* a = acc + i * D;
#pragma omp simd
      for (int d = 0; d < D; ++d) a[d] += p * x[d];
    }
  }
  return;
#endif
  Vec a[R][NV];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) a[i][v] = Vec::loadu(acc + (i * NV + v) * W);
  for (int64_t t = 0; t < n; ++t) {
    Vec x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load_vec(vb + t * stride + v * W);
    for (int i = 0; i < R; ++i) {
      const Vec p(w[i * row_stride + t]);
      for (int v = 0; v < NV; ++v) a[i][v] = at::vec::fmadd(p, x[v], a[i][v]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < NV; ++v) a[i][v].store(acc + (i * NV + v) * W);
}

// add_values_rows for rb (1..R) rows: the largest instantiation that fits, one call.
template <typename T, int NV, int R>
void add_values_upto(int64_t rb, float* acc, const float* w, int64_t row_stride, const T* vb, int64_t stride,
                     int64_t n) {
  if constexpr (R > 1) {
    if (rb < R) return add_values_upto<T, NV, R - 1>(rb, acc, w, row_stride, vb, stride, n);
  }
  add_values_rows<T, NV, R>(acc, w, row_stride, vb, stride, n);
}

// One work item: a tile of queries of one request, every head (fast_item.h). Three passes over the
// context, not an online softmax: all scores, then each row's max, weights and sum in one sweep, then
// the weighted values. An online softmax puts a dependent chain (block max, rescale, exp, sum) between
// every block's scores and its values, and the core sat waiting on it; here each pass is a run of
// independent work, and the scores ([rows, context] floats) stay in cache (on AVX-512 the three
// passes measured 1.3-1.5x the online form in cache). Every KV head is served from the same
// sub-block of W tokens: a token's K (and V) row for all heads is one contiguous run of memory, read
// in order.
template <typename Q, typename C, int NV>
void attend_item_fast(const Item& item, const Q* query, int64_t q_stride, const C* k_cache, const C* v_cache,
                      const int32_t* table, Q* out, int64_t num_heads, int64_t num_kv_heads, int64_t block_size,
                      const Scoring& scoring, std::vector<float>& scratch) {
  constexpr int D = NV * W;
  constexpr int RB = rows_per_chunk<NV>();
  ItemRows<D> rows(item.first_query, item.num_queries, item.first_pos, num_heads, item.kv_count, scoring, scratch,
                   item.kv_head, num_kv_heads);
  rows.load_queries(query, q_stride);
  const int64_t token_stride = num_kv_heads * D;
  k_cache += item.kv_head * D;  // the item's heads within each token's row
  v_cache += item.kv_head * D;
  for_each_sub_block(k_cache, table, block_size, token_stride, item.kv_count * D, rows.start, rows.context,
                     [&](int64_t base, int64_t n, const C* kb) {
                       for (int64_t r = 0; r < rows.rows; ++r) {
                         if (!rows.reads(r, r, base, n)) continue;  // lanes outside the row are masked below
                         const Vec s = row_scores<NV>(rows.q + r * D, rows.query_row(query, q_stride, r),
                                                      kb + (r / rows.head_rows) * D, token_stride, n, scoring.scale);
                         rows.shaped(s).store(rows.weights_at(r, base), n);
                       }
                     });
  rows.softmax();
  for_each_sub_block(v_cache, table, block_size, token_stride, item.kv_count * D, rows.start, rows.context,
                     [&](int64_t base, int64_t n, const C* vb) {
                       rows.for_each_chunk(RB, [&](int64_t h, int64_t r0, int64_t rb) {
                         add_values_upto<C, NV, RB>(rb, rows.acc + r0 * D, rows.weights_at(r0, base),
                                                    rows.row_stride, vb + h * D, token_stride, n);
                       });
                     });
  rows.write_out(out, num_heads);
}

// The fast item function for this head_dim, or nullptr (the generic path serves it).
template <typename Q, typename C>
using ItemFn = void (*)(const Item&, const Q*, int64_t, const C*, const C*, const int32_t*, Q*, int64_t, int64_t,
                        int64_t, const Scoring&, std::vector<float>&);

template <typename Q, typename C, int NV = kMaxHeadDim / W>
ItemFn<Q, C> fast_item_fn(int64_t head_dim) {
  if (head_dim == NV * W) return attend_item_fast<Q, C, NV>;
  if constexpr (NV > 1) return fast_item_fn<Q, C, NV - 1>(head_dim);
  return nullptr;
}

template <typename Q, typename C>
void run_items(const std::vector<Item>& items, const std::vector<int64_t>& order, int threads,
               const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const Scoring& scoring, bool generic, at::Tensor& out) {
  const Q* q = query.data_ptr<Q>();
  const C* kc = k_cache.data_ptr<C>();
  const C* vc = v_cache.data_ptr<C>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  Q* o = out.data_ptr<Q>();
  const int64_t width = block_tables.size(1), num_heads = query.size(1), head_dim = query.size(2);
  const int64_t q_stride = query.stride(0);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t num_items = static_cast<int64_t>(items.size());
  const ItemFn<Q, C> fast = generic ? nullptr : fast_item_fn<Q, C>(head_dim);
  // Our own parallel region on torch's OpenMP runtime (the same libgomp, already loaded), for the
  // dynamic schedule: at::parallel_for hands out equal contiguous ranges.
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < num_items; ++w) {
      const Item& it = items[order[w]];
      const int32_t* table = tables + it.request * width;
      if (fast != nullptr) {
        fast(it, q, q_stride, kc, vc, table, o, num_heads, num_kv_heads, block_size, scoring, scratch);
        continue;
      }
      attend_item<Q, C>(it, q, q_stride, kc, vc, table, o, num_heads, num_kv_heads, head_dim, block_size,
                        scoring, scratch);
    }
  }
}

// Fewer fast items than threads (one request decoding, a few short ones): each item becomes one per KV
// head, so the other threads share the work instead of waiting at the join. A decode step of one
// request was one item on one of the 2 cores; split, its 3 (SmolLM2) or 4 KV heads go to both. Every
// row's sums run in the same order split or not: only which thread computes them changes.
void split_heads(std::vector<Item>& items, int64_t num_kv_heads) {
  if (num_kv_heads == 1 || static_cast<int64_t>(items.size()) >= at::get_num_threads()) return;
  std::vector<Item> split;
  split.reserve(items.size() * num_kv_heads);
  for (const Item& it : items)
    for (int64_t h = 0; h < num_kv_heads; ++h)
      split.push_back({it.request, h, 1, it.first_query, it.num_queries, it.first_pos, it.cost / num_kv_heads});
  items.swap(split);
}

void attend(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_tables,
            double scale, int64_t window, double softcap, bool generic, at::Tensor& out) {
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4, "query [T, H, D], k_cache [N, block, kv, D]");
  // query may be a view into the fused q/k/v output: tokens at any stride, each token's heads packed.
  TORCH_CHECK(query.stride(2) == 1 && query.stride(1) == query.size(2) && query.stride(0) >= query.size(1) * query.size(2),
              "paged_attention needs each token's query heads contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && out.is_contiguous() && block_tables.is_contiguous(),
              "paged_attention needs contiguous caches, out and block_tables");
  TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type() && out.scalar_type() == query.scalar_type(),
              "the caches must share one dtype, and out the query's");
  // A float32 model may keep its K/V in bfloat16 (half the bytes a decode step reads); otherwise the
  // caches hold the query's dtype.
  const at::ScalarType qt = query.scalar_type(), ct = k_cache.scalar_type();
  TORCH_CHECK((qt == at::kFloat || qt == at::kBFloat16) && (ct == qt || (qt == at::kFloat && ct == at::kBFloat16)),
              "paged_attention takes float32 or bfloat16 queries over caches of the same dtype, or float32 "
              "queries over bfloat16 caches; got ", qt, " over ", ct);
  TORCH_CHECK(query_start_loc.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  block_tables.scalar_type() == at::kInt,
              "query_start_loc, seq_lens and block_tables must be int32");
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim && num_heads % num_kv_heads == 0, "head shapes do not match");
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0 (0: none), got ", window);
  TORCH_CHECK(softcap >= 0.0, "paged_attention: softcap must be >= 0 (0: none), got ", softcap);
  const Scoring scoring{static_cast<float>(scale), window, static_cast<float>(softcap)};

  // The fast path takes every KV head of a query tile in one item; the generic one, one head.
  // The fast path takes the same head dims whatever the dtypes.
  const bool all_heads = !generic && fast_item_fn<float, float>(head_dim) != nullptr;
  std::vector<Item> items;
  paged_step::for_each_tile(query_start_loc, seq_lens, block_size, block_tables.size(1), scoring,
                            [&](int64_t b, int64_t first_query, int64_t nq, int64_t first_pos, int64_t span) {
                              if (all_heads) {
                                items.push_back({b, 0, num_kv_heads, first_query, nq, first_pos, num_kv_heads * nq * span});
                                return;
                              }
                              for (int64_t h = 0; h < num_kv_heads; ++h) {
                                items.push_back({b, h, 1, first_query, nq, first_pos, nq * span});
                              }
                            });
  if (all_heads) split_heads(items, num_kv_heads);
  const std::vector<int64_t> order = paged_step::longest_first(items);
  const int threads = paged_step::threads_for(items.size());

  if (qt == at::kFloat && ct == at::kFloat) {
    run_items<float, float>(items, order, threads, query, k_cache, v_cache, block_tables, scoring, generic, out);
  } else if (qt == at::kFloat) {
    run_items<float, c10::BFloat16>(items, order, threads, query, k_cache, v_cache, block_tables, scoring, generic,
                                    out);
  } else {
    run_items<c10::BFloat16, c10::BFloat16>(items, order, threads, query, k_cache, v_cache, block_tables, scoring,
                                            generic, out);
  }
}

// n float32 values rounded to bfloat16 (nearest even, as c10::BFloat16 rounds).
inline void narrow_row(c10::BFloat16* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store(dst + i, src[i]);
}

// This step's K and V rows into their cache slots: one copy of each token's row (every KV head),
// where the indexed assignment it replaces dispatched two index_put_ calls per layer.
// key, value: [T, kv, D] with each token's heads contiguous (views into the fused q/k/v output are).
void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes() && k_cache.dim() == 4 &&
                  v_cache.sizes() == k_cache.sizes(),
              "write_kv: key/value [T, kv, D], caches [N, block, kv, D]");
  TORCH_CHECK(key.size(1) == k_cache.size(2) && key.size(2) == k_cache.size(3), "write_kv: head shapes do not match");
  TORCH_CHECK(value.scalar_type() == key.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type(),
              "write_kv: key and value must share one dtype, and the caches another");
  // float32 rows into bfloat16 caches are rounded (to nearest even) as they are written.
  const bool narrow = key.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() || narrow,
              "write_kv: caches of ", k_cache.scalar_type(),
              " take rows of that dtype (or float32 into bfloat16), got ", key.scalar_type());
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "write_kv: caches must be contiguous");
  const int64_t row = key.size(1) * key.size(2);
  TORCH_CHECK(key.stride(2) == 1 && key.stride(1) == key.size(2) && value.stride(2) == 1 &&
                  value.stride(1) == value.size(2),
              "write_kv: each token's heads must be contiguous in key and value");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) &&
                  slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "write_kv: slot_mapping must be int64 [T]");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t bytes = row * static_cast<int64_t>(k_cache.element_size());
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t k_stride = key.stride(0) * static_cast<int64_t>(key.element_size());
  const int64_t v_stride = value.stride(0) * static_cast<int64_t>(value.element_size());
  for (int64_t t = 0; t < key.size(0); ++t) {  // all checked before any is written
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "write_kv: token ", t, " has slot ", slots[t],
                ", outside the cache's ", num_slots);
  }
  // Threads only for a prefill's worth of rows: a decode step's copy is shorter than waking them.
  at::parallel_for(0, key.size(0), 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (narrow) {
        narrow_row(reinterpret_cast<c10::BFloat16*>(kc + slots[t] * bytes),
                   reinterpret_cast<const float*>(k + t * k_stride), row);
        narrow_row(reinterpret_cast<c10::BFloat16*>(vc + slots[t] * bytes),
                   reinterpret_cast<const float*>(v + t * v_stride), row);
        continue;
      }
      std::memcpy(kc + slots[t] * bytes, k + t * k_stride, static_cast<size_t>(bytes));
      std::memcpy(vc + slots[t] * bytes, v + t * v_stride, static_cast<size_t>(bytes));
    }
  });
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def(
      "paged_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
      "Tensor seq_lens, Tensor block_tables, float scale, int window, float softcap, Tensor(a!) out) -> ()");
  m.def(
      "paged_attention_generic(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
      "Tensor seq_lens, Tensor block_tables, float scale, int window, float softcap, Tensor(a!) out) -> ()");
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("paged_attention", &paged_step::op<attend, false>);
  // The generic algorithm alone, in this build's ISA (what paged_attention runs for the head dims the
  // fast path does not take), kept callable so the tests hold it to torch on every path and the
  // microbenchmark can set it beside the fast one.
  m.impl("paged_attention_generic", &paged_step::op<attend, true>);
  m.impl("write_kv", &write_kv);
}
