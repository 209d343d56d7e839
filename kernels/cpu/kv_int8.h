// int8 KV attention, shared by its two sources: kv_int8.cpp (the op, its work items, the scalar item
// that serves any head_dim) and kv_int8_attention.cpp (the vector item, per ISA path).
//
// Cache layout (kernels/kv_int8.py): per layer K and V, int8 [num_blocks, block_size, kv_heads, D + 4]:
// each (slot, head) row is its D values as int8, then its scale as a float32 in the last 4 bytes.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_math.h"

namespace kv_int8 {
inline namespace PAGEDSERVE_LIBRARY {

using attention_math::Scoring;

constexpr int64_t kScaleBytes = 4;
// A tile of up to paged_step::kQueryTile queries of one request, every KV head.
struct Item {
  int64_t request;
  int64_t first_query;  // index into the packed query
  int64_t num_queries;
  int64_t first_pos;  // context position of the first query
  int64_t cost;       // rows x positions read, to hand out the long items first
};

// One layer's int8 K and V caches.
struct Cache {
  const int8_t* k;
  const int8_t* v;
  int64_t block_size;
  int64_t num_kv_heads;
  int64_t head_dim;

  int64_t row_bytes() const { return head_dim + kScaleBytes; }
  int64_t token_bytes() const { return num_kv_heads * row_bytes(); }
  // Byte offset of context position `pos`'s row for every head, through the request's block table.
  int64_t token_offset(const int32_t* table, int64_t pos) const {
    return (static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size) * token_bytes();
  }
};

inline float row_scale(const int8_t* row, int64_t D) {
  float s;
  std::memcpy(&s, row + D, sizeof(s));
  return s;
}

// Attention of one item's queries (float32 or bf16) over its request's int8 context, into `out`.
template <typename T>
using ItemFn = void (*)(const Item& item, const T* query, int64_t q_stride, const Cache& cache, const int32_t* table,
                        T* out, int64_t num_heads, const Scoring& scoring, std::vector<float>& scratch);

// The vector item for this head_dim on this build (a multiple of the vector width up to 128), or
// nullptr: the scalar item serves the others.
template <typename T>
ItemFn<T> vector_item(int64_t head_dim);

}  // namespace PAGEDSERVE_LIBRARY
}  // namespace kv_int8
