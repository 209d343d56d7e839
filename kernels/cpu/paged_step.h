// What both paged attention ops (paged_attention.cpp over float K/V, kv_int8.cpp over int8 K/V) do
// around their work items: one step's requests cut into tiles of queries, the items handed out
// longest first, and each op's two entry points (the fast item where it serves the head_dim, or the
// generic one alone, which the tests hold to the reference on every path).
#pragma once

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention_math.h"

namespace paged_step {
inline namespace PAGEDSERVE_LIBRARY {

constexpr int64_t kQueryTile = 16;

// fn(b, first_query, nq, first_pos, span) for each tile of up to kQueryTile queries of each request b:
// first_query indexes the packed query, first_pos is its context position, span the positions the tile
// reads (its first query's window starts earliest). Each request is checked against its context and
// the block table's width first.
template <typename F>
void for_each_tile(const at::Tensor& query_start_loc, const at::Tensor& seq_lens, int64_t block_size,
                   int64_t table_width, const attention_math::Scoring& scoring, F&& fn) {
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < seq_lens.size(0); ++b) {
    const int64_t q_len = starts[b + 1] - starts[b];
    const int64_t first = lens[b] - q_len;
    TORCH_CHECK(first >= 0, "request ", b, ": ", q_len, " queries exceed its context of ", lens[b]);
    TORCH_CHECK((lens[b] + block_size - 1) / block_size <= table_width, "request ", b,
                ": its context needs more blocks than block_tables has columns");
    for (int64_t i = 0; i < q_len; i += kQueryTile) {
      const int64_t nq = std::min(kQueryTile, q_len - i);
      fn(b, starts[b] + i, nq, first + i, first + i + nq - scoring.first_visible(first + i));
    }
  }
}

// The items' indices, the costliest first: contexts differ by 10x within a batch, so the long items
// go out first and the threads, handed one item at a time, finish close together.
template <typename Item>
std::vector<int64_t> longest_first(const std::vector<Item>& items) {
  std::vector<int64_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return items[a].cost > items[b].cost; });
  return order;
}

// torch's thread count, but no more threads than items.
inline int threads_for(size_t num_items) {
  return std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>(num_items)));
}

// An op's whole step, `generic` forcing the generic item for every head_dim.
using Attend = void (*)(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_tables,
                        double scale, int64_t window, double softcap, bool generic, at::Tensor& out);

// The registered op (schema: "(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc,
// Tensor seq_lens, Tensor block_tables, float scale, int window, float softcap, Tensor(a!) out) -> ()").
template <Attend attend, bool generic>
void op(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
        const at::Tensor& query_start_loc, const at::Tensor& seq_lens, const at::Tensor& block_tables, double scale,
        int64_t window, double softcap, at::Tensor& out) {
  attend(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, window, softcap, generic, out);
}

}  // namespace PAGEDSERVE_LIBRARY
}  // namespace paged_step
