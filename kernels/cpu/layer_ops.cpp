// The decoder layer's small ops, fused: one call and one pass over the rows each, instead of the 2-8
// torch ops (and as many Python calls and temporaries) they take written op by op.
//
//   pagedserve_ops::rms_norm(x, weight, eps) -> out
//   pagedserve_ops::fused_add_rms_norm(x, residual, weight, eps): residual += x; x = rms_norm(residual)
//   pagedserve_ops::silu_and_mul(gate_up) -> silu(gate) * up, gate_up = [gate | up] per row
//   pagedserve_ops::rotary_(x, cos, sin): x [T, heads, D] rotated in place ("rotate half" pairs)
//   pagedserve_ops::moe_route(x, router, top_k, normalize) -> (expert ids [T, k], weights [T, k] in x's dtype)
//
// Each op does what Hugging Face's modules and our torch forms do op by op, with the same roundings:
// the norm in float32 whatever the dtype (sum of squares, / D, + eps, 1 / sqrt), rounded to the
// model dtype, then times the weight in the model dtype; the residual sum rounded to the model
// dtype; SiLU rounded before the multiply; each of the rotation's products and sums rounded, as
// rope.apply_rotary_'s six ops round them. Built with -ffp-contract=off: a fused multiply-add would
// round once where torch rounds twice. float32 and bfloat16, any row length (masked tails).
// Rounding to bfloat16 is to nearest even, and a NaN stays a NaN (its bits differ by path, below).
//
// A separate library from paged_attention.cpp's `pagedserve`, so the two build and load apart.
//
// One source, three ISA paths (kernels/cpu/isa.py builds it once per path, each its own torch.ops
// namespace): the ops are written over ATen's at::vec::Vectorized<float>, whose width and
// instructions follow the CPU_CAPABILITY_* macro the path is built with.
//   avx512   16 float32 lanes; a row's tail by masked loads and stores; exp is Sleef_expf16_u10
//            (torch's own, exported by libtorch_cpu). bfloat16 in and out by 16-bit masked loads
//            and stores, rounded by c10's integer rounding (NaN -> 0x7FC0), or, where the CPU has
//            AVX512-BF16, by its one instruction (which flushes float32 denormals, < 1.2e-38, to
//            zero: no activation or weight of these models is one). The same instructions as the
//            AVX-512-only intrinsics this file was before, tails now after the whole vectors.
//   avx2     8 lanes; tails by AVX2's 32-bit masked loads and stores (bfloat16 tails through a
//            buffer); exp is Sleef_expf8_u10; bfloat16 loads and stores by torch's AVX2
//            conversions (at::vec::cvtbf16_fp32 / cvtfp32_bf16: round to nearest even, NaN ->
//            0xFFFF), and a value rounded and re-read (`rounded`) by the same rounding done in the
//            float32 bits, without the pack to 16 bits and back: 12-30% faster, the same bits.
//   portable no ISA flag: Vectorized's generic form (x86-64: 8 lanes over arrays, which g++
//            vectorizes with SSE2 where it can; ARM64: torch's NEON Vectorized); exp is libm's
//            expf lane by lane (not Sleef: float32 SiLU may differ from torch's by an ulp);
//            bfloat16 by c10::BFloat16's scalar rounding (NaN -> 0x7FC0).
// The sum of squares adds one accumulator per lane, then the lanes (_mm512_reduce_add_ps on
// avx512, in lane order elsewhere): the only order that differs from torch's.
//
// Measured on an AMD EPYC (Zen 3, family 25 model 1: AVX2 + FMA + F16C, no AVX-512), one thread,
// other builds sharing its 2 cores (load average 4-5, so the minimum of 150 interleaved repeats),
// SmolLM2-135M's shapes, microseconds per layer, torch forms | avx2 | portable
// (`ops/microbench/layer_ops_ab.py --threads 1 --repeats 150 --tokens 1 4 64 512`):
//   float32   T=1    rotary 23.2 | 4.2 | 3.8   2x add+norm 101 | 13.0 | 10.2   SiLU-mul 13.5 | 7.0 | 13.5
//             T=4    rotary 26.9 | 5.2 | 5.7   2x add+norm 94.6 | 12.2 | 10.1   SiLU-mul 27.5 | 15.9 | 42.1
//             T=64   rotary 81.3 | 20.2 | 40.9   2x add+norm 224 | 51.1 | 118   SiLU-mul 202 | 143 | 636
//             T=512  rotary 413 | 109 | 308   2x add+norm 1086 | 295 | 903   SiLU-mul 2274 | 1407 | 3998
//   bfloat16  T=1    rotary 24.4 | 4.2 | 5.9   2x add+norm 118 | 14.3 | 12.7   SiLU-mul 14.5 | 7.7 | 16.9
//             T=4    rotary 31.2 | 6.6 | 16.5   2x add+norm 133 | 18.7 | 25.2   SiLU-mul 23.9 | 16.5 | 50.8
//             T=64   rotary 128 | 45.0 | 178   2x add+norm 281 | 89.8 | 260   SiLU-mul 230 | 203 | 667
//             T=512  rotary 512 | 229 | 1056   2x add+norm 1146 | 488 | 1327   SiLU-mul 1800 | 1615 | 6556
// avx2 beats the torch forms everywhere (bfloat16 SiLU-and-mul least: 1.1-1.2x from T=64, its
// three roundings cost nearly what the fusion saves); portable wins on the norms and the rotation
// at small T and loses on SiLU (libm's expf per lane against torch's AVX2 Sleef: torch picks its
// own AVX2 kernels at run time; portable is for CPUs without AVX2, where torch's kernels take the
// generic Vectorized, libm's expf included, too). With 2 threads on these busy cores, an op whose
// rows fill two threads' grain (kElementsPerThread) waited ~16 ms for the second thread most calls.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include "lane_sum.h"
#include "library.h"
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// float32 and bfloat16 only (AT_DISPATCH_FLOATING_TYPES would also instantiate double).
#define DISPATCH_FLOAT_AND_BF16(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
// Below this many elements per thread a second thread costs more (fork/join) than it saves.
constexpr int64_t kElementsPerThread = 32768;

// f(d, n) over [0, size) in whole vectors (n == kLanes, a constant the loads fold on) and at
// most one tail (0 < n < kLanes: masked, the lanes past n load 0 and store nothing).
template <typename F>
inline void for_each_chunk(int64_t size, F f) {
  int64_t d = 0;
  for (; d + kLanes <= size; d += kLanes) f(d, kLanes);
  if (d < size) f(d, size - d);
}

inline Vec load(const float* p, int64_t n) { return n >= kLanes ? Vec::loadu(p) : Vec::loadu(p, n); }
inline void store(float* p, const Vec& v, int64_t n) {
  if (n >= kLanes)
    v.store(p);
  else
    v.store(p, static_cast<int>(n));
}
// v rounded to T's precision and widened back: the value torch's op would have stored and re-read.
inline Vec rounded(float*, const Vec& v) { return v; }

#if defined(CPU_CAPABILITY_AVX512)

inline __mmask16 tail_mask(int64_t n) { return n >= kLanes ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }

inline __m512 widen(__m256i bits) {  // bf16 is the top half of a float32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline Vec load(const c10::BFloat16* p, int64_t n) {
  return widen(n >= kLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                           : _mm256_maskz_loadu_epi16(tail_mask(n), p));
}

// float32 -> bfloat16 bits, round to nearest even (c10::BFloat16's rounding; NaN stays NaN). One
// instruction where the CPU has AVX512-BF16; else the integer rounding c10 does.
inline __m256i to_bf16_bits(__m512 v) {
#if defined(__AVX512BF16__)
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
#endif
}

inline void store(c10::BFloat16* p, const Vec& v, int64_t n) {
  const __m256i bits = to_bf16_bits(v);
  if (n >= kLanes)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
  else
    _mm256_mask_storeu_epi16(p, tail_mask(n), bits);
}
inline Vec rounded(c10::BFloat16*, const Vec& v) { return widen(to_bf16_bits(v)); }

// The 16 lanes' sum, as _mm512_reduce_add_ps adds them (halves, then halves again).
inline float sum_lanes(const Vec& v) { return _mm512_reduce_add_ps(v); }

#elif defined(CPU_CAPABILITY_AVX2)

inline Vec load(const c10::BFloat16* p, int64_t n) {
  __m128i bits;
  if (n >= kLanes) {
    bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {  // no 16-bit masked load in AVX2: the tail through a zeroed buffer
    alignas(16) uint16_t buffer[kLanes] = {};
    std::memcpy(buffer, p, n * sizeof(uint16_t));
    bits = _mm_load_si128(reinterpret_cast<const __m128i*>(buffer));
  }
  __m256 out;
  at::vec::cvtbf16_fp32(bits, out);
  return out;
}
inline void store(c10::BFloat16* p, const Vec& v, int64_t n) {
  const __m128i bits = at::vec::cvtfp32_bf16(__m256(v));  // round to nearest even, NaN -> 0xFFFF
  if (n >= kLanes) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bits);
  } else {
    alignas(16) uint16_t buffer[kLanes];
    _mm_store_si128(reinterpret_cast<__m128i*>(buffer), bits);
    std::memcpy(p, buffer, n * sizeof(uint16_t));
  }
}
// The value cvtfp32_bf16 stores, widened back, without packing to 16 bits and back: round to
// nearest even in the float32 bits, clear the low half; a NaN becomes 0xFFFF0000, as 0xFFFF reads.
inline Vec rounded(c10::BFloat16*, const Vec& v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_or_si256(r, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

#endif

#if !defined(CPU_CAPABILITY_AVX512) && !defined(CPU_CAPABILITY_AVX2)

// The portable path: c10::BFloat16's own conversions, lane by lane through a buffer.
inline Vec load(const c10::BFloat16* p, int64_t n) {
  alignas(64) float buffer[kLanes] = {};
  for (int64_t i = 0; i < std::min(n, kLanes); ++i) buffer[i] = static_cast<float>(p[i]);
  return Vec::loadu(buffer);
}
inline void store(c10::BFloat16* p, const Vec& v, int64_t n) {
  alignas(64) float buffer[kLanes];
  v.store(buffer);
  for (int64_t i = 0; i < std::min(n, kLanes); ++i) p[i] = c10::BFloat16(buffer[i]);
}
inline Vec rounded(c10::BFloat16*, const Vec& v) {
  alignas(64) float buffer[kLanes];
  v.store(buffer);
  for (int64_t i = 0; i < kLanes; ++i) buffer[i] = static_cast<float>(c10::BFloat16(buffer[i]));
  return Vec::loadu(buffer);
}

#endif

#if !defined(CPU_CAPABILITY_AVX512)
using lane_sum::sum_lanes;  // in lane order
#endif

template <typename T>
inline Vec rounded(const Vec& v) {
  return rounded(static_cast<T*>(nullptr), v);
}

// mean(x^2) + eps, then 1 / sqrt, as `xf.pow(2).mean(-1) + eps` and `torch.rsqrt` compute it. The
// sum of squares adds in another order than torch's sum kernel (one accumulator per lane, then
// across the lanes), so float32 norms may differ from torch's in the last bit or two; everything
// after it rounds alike.
template <typename T>
float inverse_rms(const T* x, int64_t D, float eps) {
  Vec acc(0.0f);
  for_each_chunk(D, [&](int64_t d, int64_t n) {
    const Vec v = load(x + d, n);  // masked-off lanes load 0 and add nothing
    acc = acc + v * v;
  });
  return 1.0f / std::sqrt(sum_lanes(acc) / static_cast<float>(D) + eps);
}

// out = weight * (x * inv_rms rounded to T), rounded to T.
template <typename T>
void scale_row(const T* x, const T* weight, T* out, int64_t D, float inv_rms) {
  const Vec r(inv_rms);
  for_each_chunk(D, [&](int64_t d, int64_t n) {
    const Vec normed = rounded<T>(load(x + d, n) * r);
    store(out + d, load(weight + d, n) * normed, n);
  });
}

// residual = x + residual rounded to T (the sum that continues down the residual stream).
template <typename T>
void add_into(const T* x, T* residual, int64_t D) {
  for_each_chunk(D, [&](int64_t d, int64_t n) { store(residual + d, load(x + d, n) + load(residual + d, n), n); });
}

template <typename T>
void silu_mul_row(const T* gate, const T* up, T* out, int64_t I) {
  const Vec one(1.0f);
  for_each_chunk(I, [&](int64_t d, int64_t n) {
    const Vec g = load(gate + d, n);
    const Vec silu = rounded<T>(g / (one + g.neg().exp()));  // exp(-g): Sleef on avx2/avx512
    store(out + d, silu * load(up + d, n), n);
  });
}

// One head's "rotate half": (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), every product and
// sum rounded to T as apply_rotary_'s separate ops round them.
template <typename T>
void rotate_head(T* x, const T* cos, const T* sin, int64_t half) {
  for_each_chunk(half, [&](int64_t d, int64_t n) {
    const Vec x1 = load(x + d, n), x2 = load(x + half + d, n);
    const Vec c = load(cos + d, n), s = load(sin + d, n);
    const Vec x2_sin = rounded<T>(x2 * s), x1_sin = rounded<T>(x1 * s);
    store(x + d, rounded<T>(x1 * c) - x2_sin, n);
    store(x + half + d, rounded<T>(x2 * c) + x1_sin, n);
  });
}

// Rows of x [..., D] (last dimension contiguous, any outer strides) in parallel where there are
// enough elements to pay for a second thread; row(i, offset) gets the row's element offset.
template <typename Row>
void for_each_row(const at::Tensor& x, Row row) {
  const int64_t D = x.size(-1), rows = D == 0 ? 0 : x.numel() / D;
  const int64_t outer_dims = x.dim() - 1;
  const int64_t grain = std::max<int64_t>(1, kElementsPerThread / std::max<int64_t>(D, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t offset = 0, rest = i;
      for (int64_t dim = outer_dims - 1; dim >= 0; --dim) {
        offset += (rest % x.size(dim)) * x.stride(dim);
        rest /= x.size(dim);
      }
      row(i, offset);
    }
  });
}

void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(x.device().is_cpu(), op, ": x must be on the CPU, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, op,
              ": dtype must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.stride(-1) == 1, op, ": x's last dimension must be contiguous");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1) && weight.is_contiguous(), op,
              ": weight must be contiguous [", x.size(-1), "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": weight dtype ", weight.scalar_type(),
              " differs from x's ", x.scalar_type());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "rms_norm");
  at::Tensor out = at::empty(x.sizes(), x.options());  // contiguous, whatever x's strides
  const int64_t D = x.size(-1);
  DISPATCH_FLOAT_AND_BF16(x.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    for_each_row(x, [&](int64_t i, int64_t offset) {
      const scalar_t* row = src + offset;
      scale_row(row, w, dst + i * D, D, inverse_rms(row, D, static_cast<float>(eps)));
    });
  });
  return out;
}

void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "fused_add_rms_norm");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && residual.sizes() == x.sizes() &&
                  residual.scalar_type() == x.scalar_type(),
              "fused_add_rms_norm: x and residual must be contiguous, of one shape and dtype; got ",
              x.sizes(), " and ", residual.sizes());
  const int64_t D = x.size(-1);
  DISPATCH_FLOAT_AND_BF16(x.scalar_type(), "fused_add_rms_norm", [&] {
    scalar_t* xs = x.data_ptr<scalar_t>();
    scalar_t* res = residual.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    for_each_row(x, [&](int64_t i, int64_t) {
      scalar_t* row = xs + i * D;
      scalar_t* sum = res + i * D;
      add_into(row, sum, D);
      scale_row(sum, w, row, D, inverse_rms(sum, D, static_cast<float>(eps)));
    });
  });
}

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.dim() == 2 && gate_up.stride(-1) == 1,
              "silu_and_mul: gate_up must be a CPU [rows, 2 * I] tensor with contiguous rows");
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16,
              "silu_and_mul: dtype must be float32 or bfloat16, got ", gate_up.scalar_type());
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "silu_and_mul: gate_up's width must be even, got ", gate_up.size(1));
  const int64_t I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), I}, gate_up.options());
  DISPATCH_FLOAT_AND_BF16(gate_up.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* src = gate_up.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    for_each_row(out, [&](int64_t i, int64_t) {
      const scalar_t* row = src + i * gate_up.stride(0);
      silu_mul_row(row, row + I, dst + i * I, I);
    });
  });
  return out;
}

void rotary_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.stride(-1) == 1,
              "rotary_: x must be a CPU [tokens, heads, head_dim] tensor with contiguous heads");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "rotary_: dtype must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.size(2) % 2 == 0, "rotary_: head_dim must be even, got ", x.size(2));
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2;
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->dim() >= 2 && t->size(0) == tokens &&
                    t->size(-1) == half && t->numel() == tokens * half && t->stride(-1) == 1,
                "rotary_: cos and sin must be [tokens, 1, head_dim / 2] = [", tokens, ", 1, ", half, "] in ",
                x.scalar_type(), ", got ", t->sizes(), " in ", t->scalar_type());
  }
  const int64_t grain = std::max<int64_t>(1, kElementsPerThread / std::max<int64_t>(heads * 2 * half, 1));
  DISPATCH_FLOAT_AND_BF16(x.scalar_type(), "rotary_", [&] {
    scalar_t* base = x.data_ptr<scalar_t>();
    const scalar_t* c = cos.data_ptr<scalar_t>();
    const scalar_t* s = sin.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t h = 0; h < heads; ++h)
          rotate_head(base + t * x.stride(0) + h * x.stride(1), c + t * cos.stride(0), s + t * sin.stride(0),
                      half);
    });
  });
}

// A MoE layer's routing, the torch form's very ops (so its very bits) called from here: the router's
// linear, softmax in float32, top-k, renormalised over the k where the model says so, rounded back to
// x's dtype. One call instead of six from Python: 37-40 -> 28 us a layer at one row (moe_ab, AMD EPYC Zen
// 3, 2 threads).
std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& x, const at::Tensor& router, int64_t top_k,
                                             bool normalize) {
  TORCH_CHECK(x.dim() == 2 && router.dim() == 2 && router.size(1) == x.size(1),
              "moe_route: x must be [tokens, hidden] and router [experts, hidden], got ", x.sizes(), " and ",
              router.sizes());
  TORCH_CHECK(top_k >= 1 && top_k <= router.size(0), "moe_route: top_k must be in [1, ", router.size(0),
              "], got ", top_k);
  auto [weights, experts] = at::topk(at::softmax(at::linear(x, router), -1, at::kFloat), top_k, -1);
  if (normalize) weights.div_(weights.sum(-1, true));
  return {experts, weights.to(x.scalar_type())};
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("rotary_(Tensor(a!) x, Tensor cos, Tensor sin) -> ()");
  m.def("moe_route(Tensor x, Tensor router, int top_k, bool normalize) -> (Tensor, Tensor)");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotary_", &rotary_);
  m.impl("moe_route", &moe_route);
}
