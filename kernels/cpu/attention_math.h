// The vector math both attention kernels share (paged_attention.cpp over float K/V, kv_int8_attention.cpp
// over int8 K/V): bf16 widening, a branch-free exp and tanh (scalar and on W lanes), the transposing
// lane sum that finishes W dot products at once, and a layer's scoring rules. Built into each ISA
// path (kernels/cpu/isa.py) through ATen's Vectorized<float>, whose width W follows the build; the
// inline namespace is the build's library name, so the paths of one process never share a symbol.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace attention_math {
inline namespace PAGEDSERVE_LIBRARY {

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

// tanh(x), branch-free so loops of it vectorise: an odd polynomial below |x| = 0.625 (where 1 - e
// would cancel), (1 - e) / (1 + e) with e = exp(-2|x|) above; within 2 ulp of libm's tanhf.
inline float tanh_approx(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = a + a * z * p;
  const float e = exp_nonpositive(-2.0f * a);
  const float large = (1.0f - e) / (1.0f + e);
  return std::copysign(a < 0.625f ? small : large, x);
}

// w[lo, hi) -> exp(w - max) (max: at least each of them), and their sum: the weights of one softmax
// row, or of one block's run of it under an online softmax.
inline float exp_sum(float* w, int64_t lo, int64_t hi, float max) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = lo; t < hi; ++t) {
    const float p = exp_nonpositive(w[t] - max);
    w[t] = p;
    sum += p;
  }
  return sum;
}

// What a query may see and how its scores are shaped, the same for every request of one call:
// `window` > 0 keeps the `window` latest positions (itself included: a query at p sees p - window + 1
// .. p, the keys Hugging Face's sliding-window mask keeps, kv > q - window); 0 sees the whole causal
// context. `softcap` > 0 bends each scaled score s into softcap * tanh(s / softcap) before the
// softmax (Gemma 2); 0 leaves it.
struct Scoring {
  float scale;
  int64_t window;
  float softcap;

  // The first position a query at `pos` sees.
  int64_t first_visible(int64_t pos) const { return window > 0 ? std::max<int64_t>(0, pos + 1 - window) : 0; }
  float shape(float s) const { return softcap > 0.0f ? softcap * tanh_approx(s / softcap) : s; }
};

// ---- W lanes of ATen's Vectorized<float>: 16 on AVX-512, 8 on AVX2 and on x86's portable build, 4
// on ARM64 NEON. The fast paths take head_dim = NV * W, NV <= kMaxHeadDim / W.
using Vec = at::vec::Vectorized<float>;
constexpr int W = static_cast<int>(Vec::size());
constexpr int kMaxHeadDim = 128;

inline Vec load_vec(const float* p) { return Vec::loadu(p); }
// bf16 is the top half of a float32: W of them widened by a shift.
inline Vec load_vec(const c10::BFloat16* p) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return Vec(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return Vec(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)));
#else
  alignas(64) float widened[W];
  for (int i = 0; i < W; ++i) widened[i] = load(p[i]);
  return Vec::loadu(widened);
#endif
}

// exp_nonpositive on W lanes: the same polynomial; 2^round(t) built as the bits (round(t) + 127) << 23,
// i.e. the integer (round(t) + 127) * 2^23 (exact in float32) reinterpreted. AVX-512 has scalef.
inline Vec exp_nonpositive_vec(Vec x) {
  x = at::vec::maximum(x, Vec(-87.0f));
  const Vec t = x * Vec(1.4426950408889634f);
  const Vec r = (t + Vec(12582912.0f)) - Vec(12582912.0f);  // round to nearest
  const Vec f = t - r;
  Vec p(1.5252733804e-5f);
  p = at::vec::fmadd(p, f, Vec(1.5403530393e-4f));
  p = at::vec::fmadd(p, f, Vec(1.3333558146e-3f));
  p = at::vec::fmadd(p, f, Vec(9.6181291076e-3f));
  p = at::vec::fmadd(p, f, Vec(5.5504108665e-2f));
  p = at::vec::fmadd(p, f, Vec(2.4022650696e-1f));
  p = at::vec::fmadd(p, f, Vec(6.9314718056e-1f));
  p = at::vec::fmadd(p, f, Vec(1.0f));
#if defined(CPU_CAPABILITY_AVX512)
  return Vec(_mm512_scalef_ps(p, r));
#else
  const Vec bits = at::vec::fmadd(r, Vec(8388608.0f), Vec(127.0f * 8388608.0f));
  return p * at::vec::cast<float>(at::vec::convert_to_int_of_same_size(bits));
#endif
}

// tanh_approx on W lanes: the same polynomial and exp form, blended by |x|, x's sign put back.
inline Vec tanh_vec(Vec x) {
  const Vec a = x.abs();
  const Vec z = x * x;
  Vec p(-5.70498872745e-3f);
  p = at::vec::fmadd(p, z, Vec(2.06390887954e-2f));
  p = at::vec::fmadd(p, z, Vec(-5.37397155531e-2f));
  p = at::vec::fmadd(p, z, Vec(1.33314422036e-1f));
  p = at::vec::fmadd(p, z, Vec(-3.33332819422e-1f));
  const Vec small = at::vec::fmadd(a * z, p, a);
  const Vec e = exp_nonpositive_vec(Vec(-2.0f) * a);
  const Vec large = (Vec(1.0f) - e) / (Vec(1.0f) + e);
  return Vec::blendv(large, small, a < Vec(0.625f)) | (x & Vec(-0.0f));
}

// out lane t = the sum of v[t]'s W lanes: W dot products finished with one transposing reduction
// (AVX-512: 45 shuffles and adds for 16; AVX2: 21 for 8) instead of W horizontal sums of their own.
inline Vec sum_lanes(const Vec* v) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 w[8], x[4];
  for (int k = 0; k < 8; ++k) {  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    const __m512 a = v[2 * k], b = v[2 * k + 1];
    w[k] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int k = 0; k < 4; ++k) {  // per 128-bit lane: that lane's sums of v[4k .. 4k+3]
    const __m512d a = _mm512_castps_pd(w[2 * k]), b = _mm512_castps_pd(w[2 * k + 1]);
    x[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88), _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x88), _mm512_shuffle_f32x4(x[2], x[3], 0xDD));
  return Vec(_mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD)));
#elif defined(CPU_CAPABILITY_AVX2)
  __m256 w[4], x[2];
  for (int k = 0; k < 4; ++k) {
    const __m256 a = v[2 * k], b = v[2 * k + 1];
    w[k] = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  }
  for (int k = 0; k < 2; ++k) {
    const __m256d a = _mm256_castps_pd(w[2 * k]), b = _mm256_castps_pd(w[2 * k + 1]);
    x[k] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  // low half: v[0..3]'s sums over lanes 0-3, high half: over lanes 4-7 (and x[1] for v[4..7])
  return Vec(_mm256_add_ps(_mm256_permute2f128_ps(x[0], x[1], 0x20), _mm256_permute2f128_ps(x[0], x[1], 0x31)));
#else
  alignas(64) float lanes[W], sums[W];
  for (int t = 0; t < W; ++t) {
    v[t].store(lanes);
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += lanes[i];
    sums[t] = s;
  }
  return Vec::loadu(sums);
#endif
}

}  // namespace PAGEDSERVE_LIBRARY
}  // namespace attention_math
