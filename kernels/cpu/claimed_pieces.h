// Work split by claims, not by halves: every thread of one parallel region takes the next piece of the
// range from a shared counter until none is left.
//
// Why: at::parallel_for gives each thread a fixed share, so a region lasts as long as its slowest
// thread. On a machine whose cores the worker's threads fill, the services (scheduler, API, a client)
// run between and inside the steps, and every time one of them takes a core from a worker thread the
// whole region waits for that thread. With claims the other thread goes on with the pieces left, as
// ggml's matrix products do (a shared chunk counter). Each output is computed by one thread, whichever,
// in the same order, so results do not depend on the split.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

// f(begin, end) over [0, n) as one parallel region, in pieces claimed in order, each half the rest's even
// share (a guided schedule): the first pieces are long runs, as at::parallel_for's halves are (a thread
// streams its weights from memory, and a one-row linear of a small model takes ~20 us: fixed-size
// pieces of it cost ~40% there, measured), the last ones short enough to even out a late thread. grain:
// at::parallel_for's (the least of the range worth a thread of its own), which sets how many threads take
// part; a piece is at least a quarter of it. Inline where that gives one thread, or where this already
// runs inside a region (a MoE expert's product on its thread).
template <typename F>
void parallel_claimed(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + grain - 1) / grain);
  if (threads <= 1 || at::in_parallel_region()) {
    f(0, n);
    return;
  }
  const int64_t least = (grain + 3) / 4;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t b = next.load(std::memory_order_relaxed);
    while (b < n) {
      const int64_t piece = std::max(least, (n - b) / (2 * threads));
      if (!next.compare_exchange_weak(b, b + piece, std::memory_order_relaxed)) continue;  // b reloaded
      f(b, std::min(n, b + piece));
      b = next.load(std::memory_order_relaxed);
    }
  });
}
