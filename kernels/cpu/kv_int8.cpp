// int8 KV: the K/V write that quantizes, and paged attention that reads int8 K/V in place.
//
// Cache layout (kernels/kv_int8.py, kv_int8.h): per layer K and V, int8 [num_blocks, block_size,
// kv_heads, D + 4]: each (slot, head) row is its D values as int8, then its scale as a float32 in the
// last 4 bytes. value = int8 * scale, scale = max|x| / 127 of that row, the int8 rounded to nearest
// (ties to even, as torch.round). A row is written once, with its token, and never again: no
// rescaling of rows already committed (a worker killed mid-write leaves only uncommitted rows
// half-written, see docs/kv-persistence.md), and a new token's range never clips an older one's.
//
// Attention is dequantized in registers, scores, softmax and sums in float32 whatever the query
// dtype (float32 or bfloat16), under a layer's rules (a sliding window, a logit softcap; Scoring in
// attention_math.h). One work item per (request, tile of up to 16 queries), every KV head: a token's
// rows for all heads are one contiguous run of memory, read in order. Two items, one result:
// - the vector item (kv_int8_attention.cpp) for head_dim a multiple of the vector width up to 128;
// - the scalar item here for any head_dim: each K/V row widened once into a scratch row and used by
//   every query row that reads it (plain loops, omp simd). paged_attention_int8_generic runs it for
//   every head_dim, so the tests hold it to the reference on every path.
// Built per ISA path like the other kernels (kernels/cpu/build.py): avx512, avx2, portable.
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kv_int8.h"
#include "library.h"
#include "paged_step.h"

namespace {

using attention_math::exp_sum;
using attention_math::load;
using attention_math::store;
using kv_int8::Cache;
using kv_int8::Item;
using kv_int8::ItemFn;
using kv_int8::kScaleBytes;
using kv_int8::row_scale;
using kv_int8::Scoring;

// ---- the write

template <typename T>
void quantize_row(const T* src, int8_t* dst, int64_t D, float* widened) {
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (int64_t d = 0; d < D; ++d) {
    widened[d] = load(src[d]);
    amax = std::max(amax, std::fabs(widened[d]));
  }
  // In double, rounded once to float: the same bytes as the torch quantizer (kernels/kv_int8.py).
  const float scale = static_cast<float>(static_cast<double>(amax) / 127.0);
  const float inv = amax > 0.0f ? static_cast<float>(127.0 / static_cast<double>(amax)) : 0.0f;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) {
    // |x * inv| <= 127 up to rounding: the clamp only catches that last ulp.
    const float q = std::nearbyint(widened[d] * inv);
    dst[d] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
  }
  std::memcpy(dst + D, &scale, sizeof(scale));
}

template <typename T>
void write_rows(const at::Tensor& x, at::Tensor& cache, const int64_t* slots) {
  const int64_t tokens = x.size(0), heads = x.size(1), D = x.size(2);
  const int64_t row_bytes = D + kScaleBytes;
  const T* src = x.data_ptr<T>();
  const int64_t token_stride = x.stride(0);
  int8_t* dst = cache.data_ptr<int8_t>();
  at::parallel_for(0, tokens, 128, [&](int64_t begin, int64_t end) {
    std::vector<float> widened(static_cast<size_t>(D));
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        quantize_row(src + t * token_stride + h * D, dst + (slots[t] * heads + h) * row_bytes, D, widened.data());
      }
    }
  });
}

void write_kv_int8(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes() && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "write_kv_int8: key/value [T, kv, D], caches [N, block, kv, D + 4]");
  TORCH_CHECK(k_cache.scalar_type() == at::kChar && v_cache.scalar_type() == at::kChar, "write_kv_int8: int8 caches");
  TORCH_CHECK(key.size(1) == k_cache.size(2) && key.size(2) + kScaleBytes == k_cache.size(3),
              "write_kv_int8: caches must be [N, block, kv, head_dim + 4]");
  TORCH_CHECK(key.scalar_type() == value.scalar_type() &&
                  (key.scalar_type() == at::kFloat || key.scalar_type() == at::kBFloat16),
              "write_kv_int8: key and value float32 or bfloat16");
  TORCH_CHECK(key.stride(2) == 1 && key.stride(1) == key.size(2) && value.stride(2) == 1 &&
                  value.stride(1) == value.size(2),
              "write_kv_int8: each token's heads must be contiguous in key and value");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "write_kv_int8: caches must be contiguous");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) &&
                  slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "write_kv_int8: slot_mapping must be int64 [T]");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < key.size(0); ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "write_kv_int8: token ", t, " has slot ", slots[t],
                ", outside the cache's ", num_slots);
  }
  if (key.scalar_type() == at::kFloat) {
    write_rows<float>(key, k_cache, slots);
    write_rows<float>(value, v_cache, slots);
  } else {
    write_rows<c10::BFloat16>(key, k_cache, slots);
    write_rows<c10::BFloat16>(value, v_cache, slots);
  }
}

// ---- attention

// The scalar item: any head_dim. Three passes: all scores, each row's softmax, the values.
template <typename T>
void attend_item_scalar(const Item& item, const T* query, int64_t q_stride, const Cache& cache, const int32_t* table,
                        T* out, int64_t num_heads, const Scoring& scoring, std::vector<float>& scratch) {
  const int64_t num_kv_heads = cache.num_kv_heads, D = cache.head_dim;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t nq = item.num_queries;
  const int64_t rows = nq * num_heads;  // row r: query r / num_heads, head r % num_heads
  const int64_t context = item.first_pos + nq;
  const int64_t start = scoring.first_visible(item.first_pos);  // the first query's window starts earliest
  const int64_t span = context - start;                          // weight t of a row is position start + t
  const int64_t row_bytes = cache.row_bytes();
  scratch.resize(static_cast<size_t>(rows * (2 * D + span + 1) + D));
  float* q = scratch.data();         // [rows, D] pre-scaled
  float* acc = q + rows * D;         // [rows, D]
  float* w = acc + rows * D;         // [rows, span]: scores, then weights
  float* sums = w + rows * span;     // [rows]
  float* x = sums + rows;            // [D]: one widened K or V row
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = query + (item.first_query + r / num_heads) * q_stride + (r % num_heads) * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) q[r * D + d] = load(src[d]) * scoring.scale;
  }
  std::fill(acc, acc + rows * D, 0.0f);
  // The queries that see position t: causal (i >= t - first_pos), then the window (t >= lower(i)).
  auto first_query = [&](int64_t t) { return std::max<int64_t>(0, t - item.first_pos); };
  auto sees = [&](int64_t i, int64_t t) { return t >= scoring.first_visible(item.first_pos + i); };
  // fn(r, t, s) for every row that sees position t: t's row of the row's KV head widened once into x,
  // its scale s, used by every query head that shares the KV head.
  auto each_reader = [&](const int8_t* plane, auto&& fn) {
    for (int64_t t = start; t < context; ++t) {
      const int8_t* tok = plane + cache.token_offset(table, t);
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const int8_t* row = tok + h * row_bytes;
        const float s = row_scale(row, D);
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) x[d] = static_cast<float>(row[d]);
        for (int64_t i = first_query(t); i < nq && sees(i, t); ++i) {  // later queries' windows start later
          for (int64_t g = 0; g < group; ++g) fn(i * num_heads + h * group + g, t, s);
        }
      }
    }
  };
  // Scores: each K row dotted with the rows of its query heads that may see it.
  each_reader(cache.k, [&](int64_t r, int64_t t, float s) {
    const float* qr = q + r * D;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += qr[d] * x[d];
    w[r * span + t - start] = scoring.shape(dot * s);
  });
  // Softmax per row over the positions it sees, [lo, hi); the rest get weight 0.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = item.first_pos + r / num_heads;
    const int64_t lo = scoring.first_visible(pos) - start, hi = pos + 1 - start;
    float* wr = w + r * span;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = lo; t < hi; ++t) m = std::max(m, wr[t]);
    const float sum = exp_sum(wr, lo, hi, m);
    std::fill(wr, wr + lo, 0.0f);
    std::fill(wr + hi, wr + span, 0.0f);
    sums[r] = sum;
  }
  // Values: each V row added to every row that weighs it (weight times its scale).
  each_reader(cache.v, [&](int64_t r, int64_t t, float s) {
    const float p = w[r * span + t - start] * s;
    float* ar = acc + r * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) ar[d] += p * x[d];
  });
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = out + ((item.first_query + r / num_heads) * num_heads + r % num_heads) * D;
    const float inv = 1.0f / sums[r];
    for (int64_t d = 0; d < D; ++d) store(dst + d, acc[r * D + d] * inv);
  }
}

template <typename T>
void run_items(const std::vector<Item>& items, const std::vector<int64_t>& order, int threads, const at::Tensor& query,
               const Cache& cache, const at::Tensor& block_tables, const Scoring& scoring, bool generic,
               at::Tensor& out) {
  const T* q = query.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  T* o = out.data_ptr<T>();
  const int64_t width = block_tables.size(1), num_heads = query.size(1);
  const int64_t num_items = static_cast<int64_t>(items.size());
  ItemFn<T> attend = generic ? nullptr : kv_int8::vector_item<T>(cache.head_dim);
  if (attend == nullptr) attend = attend_item_scalar<T>;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < num_items; ++n) {
      const Item& it = items[order[n]];
      attend(it, q, query.stride(0), cache, tables + it.request * width, o, num_heads, scoring, scratch);
    }
  }
}

void attend(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_tables, double scale,
            int64_t window, double softcap, bool generic, at::Tensor& out) {
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_attention_int8: query [T, H, D], caches [N, block, kv, D + 4]");
  TORCH_CHECK(k_cache.scalar_type() == at::kChar && v_cache.scalar_type() == at::kChar,
              "paged_attention_int8: int8 caches");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "paged_attention_int8: query float32 or bfloat16");
  TORCH_CHECK(out.scalar_type() == query.scalar_type() && out.is_contiguous() && out.sizes() == query.sizes(),
              "paged_attention_int8: out like query, contiguous");
  TORCH_CHECK(query.stride(2) == 1 && query.stride(1) == query.size(2), "paged_attention_int8: each token's query heads contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && block_tables.is_contiguous(),
              "paged_attention_int8: contiguous caches and block_tables");
  TORCH_CHECK(query_start_loc.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  block_tables.scalar_type() == at::kInt,
              "paged_attention_int8: query_start_loc, seq_lens and block_tables must be int32");
  TORCH_CHECK(window >= 0, "paged_attention_int8: window must be >= 0 (0: none), got ", window);
  TORCH_CHECK(softcap >= 0.0, "paged_attention_int8: softcap must be >= 0 (0: none), got ", softcap);
  const int64_t num_heads = query.size(1), D = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D + kScaleBytes && num_heads % num_kv_heads == 0,
              "paged_attention_int8: caches must be [N, block, kv, head_dim + 4], heads a multiple of kv heads");
  const Scoring scoring{static_cast<float>(scale), window, static_cast<float>(softcap)};
  const Cache cache{k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>(), block_size, num_kv_heads, D};
  std::vector<Item> items;
  paged_step::for_each_tile(query_start_loc, seq_lens, block_size, block_tables.size(1), scoring,
                            [&](int64_t b, int64_t first_query, int64_t nq, int64_t first_pos, int64_t span) {
                              items.push_back({b, first_query, nq, first_pos, nq * span});
                            });
  const std::vector<int64_t> order = paged_step::longest_first(items);
  const int threads = paged_step::threads_for(items.size());
  if (query.scalar_type() == at::kFloat) {
    run_items<float>(items, order, threads, query, cache, block_tables, scoring, generic, out);
  } else {
    run_items<c10::BFloat16>(items, order, threads, query, cache, block_tables, scoring, generic, out);
  }
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def("write_kv_int8(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  m.def(
      "paged_attention_int8(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
      "Tensor seq_lens, Tensor block_tables, float scale, int window, float softcap, Tensor(a!) out) -> ()");
  m.def(
      "paged_attention_int8_generic(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
      "Tensor seq_lens, Tensor block_tables, float scale, int window, float softcap, Tensor(a!) out) -> ()");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("write_kv_int8", &write_kv_int8);
  m.impl("paged_attention_int8", &paged_step::op<attend, false>);
  // The scalar item for every head_dim, in this build's ISA: what paged_attention_int8 runs for the head
  // dims the vector item does not take, kept callable so the tests hold it to the reference too.
  m.impl("paged_attention_int8_generic", &paged_step::op<attend, true>);
}
