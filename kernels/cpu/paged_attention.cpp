// Paged attention on the CPU, reading K/V in place from the block-paged cache (no gathered copies).
//
// One op, pagedserve::paged_attention, for every packed query of a step (decode rows, prefill rows,
// continued chunks): query i of request b sits at position seq_len - q_len + i and attends causally
// to context positions <= that, read block by block through block_tables[b].
//
// Work item = (request, KV head, tile of up to kQueryTile queries). The tile's queries times the GQA
// group (the query heads sharing that KV head) are the item's rows, so every K/V vector read from
// memory serves all of them: GQA is folded into rows, never repeated. Softmax is online (running
// max and sum per row, rescaled per block), so nothing the size of the context is materialised.
// Inner loops run over head_dim and over a block's tokens, contiguous, written so g++ -O3 vectorises
// them (omp simd reductions, an exp with no libm call, bf16 widened by a shift). Accumulation is
// float32 whatever the cache dtype.
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kQueryTile = 16;

inline float load(float x) { return x; }
inline float load(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;  // bf16 is the top half of a float32
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline void store(float* p, float x) { *p = x; }
inline void store(c10::BFloat16* p, float x) { *p = c10::BFloat16(x); }  // round to nearest even

// exp(x) for x <= 0 (scores minus their running max): 2^round(t) * 2^f with a degree-7 polynomial
// for 2^f, f in [-0.5, 0.5]; relative error < 1e-8 before float rounding. Branch-free, so it
// vectorises; libm's expf would not, and a scalar call per score cost more than the dot products.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.4426950408889634f;
  const float r = (t + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  const float f = t - r;
  float p = 1.5252733804e-5f;
  p = p * f + 1.5403530393e-4f;
  p = p * f + 1.3333558146e-3f;
  p = p * f + 9.6181291076e-3f;
  p = p * f + 5.5504108665e-2f;
  p = p * f + 2.4022650696e-1f;
  p = p * f + 6.9314718056e-1f;
  p = p * f + 1.0f;
  const int32_t e = static_cast<int32_t>(r) + 127;
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

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
  int64_t kv_head;
  int64_t first_query;  // index into the packed query of this tile's first token
  int64_t num_queries;
  int64_t first_pos;  // context position of that first query
  int64_t cost;       // rows x context, to hand out the long items first
};

template <typename T>
void attend_item(const Item& item, const T* query, const T* k_cache, const T* v_cache, const int32_t* table,
                 T* out, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                 float scale, std::vector<float>& scratch) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t rows = item.num_queries * group;
  const int64_t D = head_dim;
  scratch.resize(static_cast<size_t>(rows * (2 * D + block_size + 3) + 2 * block_size * D));
  float* q = scratch.data();      // [rows, D], pre-scaled
  float* acc = q + rows * D;      // [rows, D]
  float* s = acc + rows * D;      // [rows, block_size]
  float* m = s + rows * block_size;
  float* l = m + rows;
  float* limit = l + rows;  // context length each row may read (causal), as float for the simd loops
  float* k_buffer = limit + rows;  // [block_size, D], used for bf16 caches only
  float* v_buffer = k_buffer + block_size * D;
  for (int64_t i = 0; i < item.num_queries; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = i * group + g;
      const T* src = query + ((item.first_query + i) * num_heads + item.kv_head * group + g) * D;
      for (int64_t d = 0; d < D; ++d) q[r * D + d] = load(src[d]) * scale;
      limit[r] = static_cast<float>(item.first_pos + i + 1);
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
    }
  }
  std::fill(acc, acc + rows * D, 0.0f);
  const int64_t context = item.first_pos + item.num_queries;  // the last query's context length
  const int64_t num_blocks = (context + block_size - 1) / block_size;
  const int64_t token_stride = num_kv_heads * D;
  for (int64_t j = 0; j < num_blocks; ++j) {
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
        if (base + t >= static_cast<int64_t>(limit[r])) continue;
        const float* qr = q + r * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * k[d];
        s[r * block_size + t] = dot;
      }
    }
    // Online softmax: rescale what each row has so far to the new running max.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t valid = std::min<int64_t>(n, static_cast<int64_t>(limit[r]) - base);
      float* sr = s + r * block_size;
      if (valid <= 0) {
        std::fill(sr, sr + n, 0.0f);
        continue;
      }
      float block_max = sr[0];
      for (int64_t t = 1; t < valid; ++t) block_max = std::max(block_max, sr[t]);
      const float new_max = std::max(m[r], block_max);
      const float alpha = exp_nonpositive(m[r] - new_max);  // 0 on the first block: m is -inf
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t t = 0; t < valid; ++t) {
        const float p = exp_nonpositive(sr[t] - new_max);
        sr[t] = p;
        sum += p;
      }
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
      T* dst = out + ((item.first_query + i) * num_heads + item.kv_head * group + g) * D;
      const float inv = 1.0f / l[r];
      for (int64_t d = 0; d < D; ++d) store(dst + d, acc[r * D + d] * inv);
    }
  }
}

template <typename T>
void run_items(const std::vector<Item>& items, const std::vector<int64_t>& order, int threads,
               const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, double scale, at::Tensor& out) {
  const T* q = query.data_ptr<T>();
  const T* kc = k_cache.data_ptr<T>();
  const T* vc = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  T* o = out.data_ptr<T>();
  const int64_t width = block_tables.size(1), num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t num_items = static_cast<int64_t>(items.size());
  // Our own parallel region on torch's OpenMP runtime (the same libgomp, already loaded), for the
  // dynamic schedule: at::parallel_for hands out equal contiguous ranges.
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < num_items; ++w) {
      const Item& it = items[order[w]];
      attend_item<T>(it, q, kc, vc, tables + it.request * width, o, num_heads, num_kv_heads, head_dim,
                     block_size, static_cast<float>(scale), scratch);
    }
  }
}

void paged_attention(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                     const at::Tensor& block_tables, double scale, at::Tensor& out) {
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4, "query [T, H, D], k_cache [N, block, kv, D]");
  TORCH_CHECK(query.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  out.is_contiguous() && block_tables.is_contiguous(),
              "paged_attention needs contiguous tensors");
  TORCH_CHECK(query.scalar_type() == k_cache.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  out.scalar_type() == query.scalar_type(),
              "query, caches and out must share one dtype");
  TORCH_CHECK(query_start_loc.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  block_tables.scalar_type() == at::kInt,
              "query_start_loc, seq_lens and block_tables must be int32");
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim && num_heads % num_kv_heads == 0, "head shapes do not match");
  const int64_t batch = seq_lens.size(0);
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t table_width = block_tables.size(1);

  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = starts[b + 1] - starts[b];
    const int64_t first = lens[b] - q_len;
    TORCH_CHECK(first >= 0, "request ", b, ": ", q_len, " queries exceed its context of ", lens[b]);
    TORCH_CHECK((lens[b] + block_size - 1) / block_size <= table_width, "request ", b,
                ": its context needs more blocks than block_tables has columns");
    for (int64_t i = 0; i < q_len; i += kQueryTile) {
      const int64_t nq = std::min(kQueryTile, q_len - i);
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        items.push_back({b, h, starts[b] + i, nq, first + i, nq * (first + i + nq)});
      }
    }
  }
  // Longest first, handed out one at a time: contexts differ by 10x within a batch.
  std::vector<int64_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return items[a].cost > items[b].cost; });
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int threads = std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>(num_items)));

  if (query.scalar_type() == at::kFloat) {
    run_items<float>(items, order, threads, query, k_cache, v_cache, block_tables, scale, out);
  } else if (query.scalar_type() == at::kBFloat16) {
    run_items<c10::BFloat16>(items, order, threads, query, k_cache, v_cache, block_tables, scale, out);
  } else {
    TORCH_CHECK(false, "paged_attention supports float32 and bfloat16, got ", query.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY(pagedserve, m) {
  m.def(
      "paged_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
      "Tensor seq_lens, Tensor block_tables, float scale, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(pagedserve, CPU, m) { m.impl("paged_attention", &paged_attention); }
