// One vector's lanes summed in lane order, left to right: the order the kernels' plain-loop
// references add in, so a sum of W lanes rounds the same on every ISA path (layer_ops.cpp's AVX-512
// path has its own tree reduction instead; quant_linear's and lora's sums take this one everywhere).
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <cstdint>

namespace lane_sum {
inline namespace PAGEDSERVE_LIBRARY {

inline float sum_lanes(const at::vec::Vectorized<float>& v) {
  constexpr int64_t kLanes = at::vec::Vectorized<float>::size();
  alignas(64) float lanes[kLanes];
  v.store(lanes);
  float sum = 0.0f;
  for (int64_t i = 0; i < kLanes; ++i) sum += lanes[i];
  return sum;
}

}  // namespace PAGEDSERVE_LIBRARY
}  // namespace lane_sum
