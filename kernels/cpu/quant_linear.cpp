// Linear layers and embedding lookups over GGUF-quantized weights, kept in their stored blocks.
//
//   quant_linear(x [M, K] float32, qweight [N, row_bytes] uint8, int type, bias?) -> [M, N] float32
//   quant_rows(qweight [N, row_bytes] uint8, int type, ids [T] int64, int K) -> [T, K] float32
//
// `qweight` is the GGUF tensor's bytes as stored, one row of blocks per output feature; `type` is the
// GGML type number: 2 Q4_0, 3 Q4_1, 8 Q8_0, 12 Q4_K. Every format is a run of 32-weight groups, each
// weight = a * code + b with one (a, b) per group:
//   Q8_0  34-byte blocks: fp16 d, 32 int8 codes                    a = d,       b = 0
//   Q4_0  18-byte blocks: fp16 d, 16 bytes of 4-bit codes          a = d,       b = -8 d
//   Q4_1  20-byte blocks: fp16 d, fp16 m, 16 bytes of codes        a = d,       b = m
//         (codes 0-15 are the bytes' low nibbles, 16-31 their high ones)
//   Q4_K  144-byte super-blocks of 256: fp16 d, fp16 dmin, 12 bytes packing eight 6-bit scales and
//         eight 6-bit mins, 128 bytes of codes (each 32 bytes hold two groups: low nibbles, high)
//                                                                  a = d sc[g], b = -dmin mn[g]
// Decoding is memory-bandwidth bound: a step reads every weight once, so Q4_1 reads 0.625 bytes a
// weight where float32 reads 4. The weights are decoded inside the dot products and never written
// back out: each group's 32 codes become float lanes, are multiplied into the accumulators of up to
// four input rows at once (read once, used by every row of the tile) and dropped.
//
// One source, three ISA paths (kernels/cpu/isa.py), over ATen's at::vec::Vectorized<float>:
//   avx2      each 8 codes widen from bytes to 32-bit lanes (vpmovzx/sx), nibbles by shift and mask,
//             converted and scaled in registers (one FMA), fp16 scales by F16C.
//   portable, avx512  each group decodes into a 32-float buffer on the stack (L1, 128 bytes) which
//             the Vectorized FMAs then read; the compiler vectorizes the decode where it can.
//             avx512 is compile-checked here (this EPYC has no AVX-512), not tuned.
// Sums are float32 in lane order per group of lanes, then the lanes: not the order of a float32
// GEMM over the dequantized weights, so results differ from that reference by rounding (~1e-6
// relative of the row's magnitude; tests/unit/kernels/test_quant_linear.py states the bound).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Half.h>
#include "library.h"
#include <torch/types.h>

#include <cstdint>
#include <cstring>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
constexpr int64_t kGroup = 32;
constexpr int64_t kChunks = kGroup / kLanes;  // vectors per group
static_assert(kGroup % kLanes == 0, "a group must be whole vectors");

enum Type : int64_t { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12 };

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  return _cvtsh_ss(bits);  // F16C: one instruction, where c10's conversion is a dozen integer ops
#else
  return c10::detail::fp16_ieee_to_fp32_value(bits);
#endif
}

// Weights per block and bytes per block of each type.
constexpr int64_t block_weights(int64_t t) { return t == Q4_K ? 256 : 32; }
constexpr int64_t block_bytes(int64_t t) {
  return t == Q8_0 ? 34 : t == Q4_0 ? 18 : t == Q4_1 ? 20 : t == Q4_K ? 144 : 0;
}

// One group of 32 weights: a, b, where its codes start, and (4-bit codes) which nibble of a byte.
struct Group {
  float a, b;
  const uint8_t* codes;
  int shift;  // Q4_K: 0 (low nibbles) or 4 (high); Q4_0 / Q4_1 take both halves of one 16-byte run
};

// Q4_K's eight 6-bit scales and mins, packed in 12 bytes: the first four of each in bytes 0-7's low
// six bits; the last four in bytes 8-11's nibbles, their top two bits in bytes 0-7's top two.
inline void q4k_scale_min(const uint8_t* packed, int64_t g, int* scale, int* min) {
  if (g < 4) {
    *scale = packed[g] & 63;
    *min = packed[g + 4] & 63;
  } else {
    *scale = (packed[g + 4] & 0xF) | ((packed[g - 4] >> 6) << 4);
    *min = (packed[g + 4] >> 4) | ((packed[g] >> 6) << 4);
  }
}

template <int64_t T>
inline Group group_at(const uint8_t* row, int64_t g) {
  if constexpr (T == Q4_K) {
    const uint8_t* block = row + (g / 8) * 144;
    const int64_t s = g % 8;
    int scale, min;
    q4k_scale_min(block + 4, s, &scale, &min);
    return {half_at(block) * scale, -half_at(block + 2) * min, block + 16 + 32 * (s / 2), static_cast<int>(4 * (s % 2))};
  } else {
    const uint8_t* block = row + g * block_bytes(T);
    const float d = half_at(block);
    if constexpr (T == Q8_0) return {d, 0.0f, block + 2, 0};
    if constexpr (T == Q4_0) return {d, -8.0f * d, block + 2, 0};
    return {d, half_at(block + 2), block + 4, 0};  // Q4_1
  }
}

// Code i (0-31) of a group, as a float.
template <int64_t T>
inline float code_at(const Group& grp, int64_t i) {
  if constexpr (T == Q8_0) return static_cast<float>(static_cast<int8_t>(grp.codes[i]));
  if constexpr (T == Q4_K) return static_cast<float>((grp.codes[i] >> grp.shift) & 0xF);
  return static_cast<float>(i < 16 ? (grp.codes[i] & 0xF) : (grp.codes[i - 16] >> 4));
}

#if defined(CPU_CAPABILITY_AVX512)

// Decodes a group 16 weights at a time, in registers (the avx2 Decoder at twice the width).
template <int64_t T>
struct Decoder {
  __m512 a, b;
  const uint8_t* codes;
  int shift;
  Decoder(const uint8_t* row, int64_t g) {
    const Group grp = group_at<T>(row, g);
    a = _mm512_set1_ps(grp.a);
    b = _mm512_set1_ps(grp.b);
    codes = grp.codes;
    shift = grp.shift;
  }
  inline Vec chunk(int64_t c) const {
    __m512i q;
    if constexpr (T == Q8_0) {
      q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * c)));
    } else {
      // Q4_0/Q4_1: chunk 0 is the low nibbles of bytes 0-15, chunk 1 their high nibbles.
      const uint8_t* bytes = T == Q4_K ? codes + 16 * c : codes;
      const int s = T == Q4_K ? shift : static_cast<int>(4 * c);
      q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
      q = _mm512_and_si512(_mm512_srl_epi32(q, _mm_cvtsi32_si128(s)), _mm512_set1_epi32(0xF));
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), a, b);
  }
};

#elif defined(CPU_CAPABILITY_AVX2)

// Decodes a group 8 weights at a time, in registers.
template <int64_t T>
struct Decoder {
  __m256 a, b;
  const uint8_t* codes;
  int shift;
  Decoder(const uint8_t* row, int64_t g) {
    const Group grp = group_at<T>(row, g);
    a = _mm256_set1_ps(grp.a);
    b = _mm256_set1_ps(grp.b);
    codes = grp.codes;
    shift = grp.shift;
  }
  inline Vec chunk(int64_t c) const {
    __m256i q;
    if constexpr (T == Q8_0) {
      q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * c)));
    } else {
      // Q4_0/Q4_1: chunks 0-1 are the low nibbles of bytes 0-15, chunks 2-3 their high nibbles.
      const uint8_t* bytes = T == Q4_K ? codes + 8 * c : codes + 8 * (c & 1);
      const int s = T == Q4_K ? shift : static_cast<int>(4 * (c >> 1));
      q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
      q = _mm256_and_si256(_mm256_srl_epi32(q, _mm_cvtsi32_si128(s)), _mm256_set1_epi32(0xF));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), a, b);
  }
};

#else

// Decodes a group into 32 floats on the stack, read back a vector at a time.
template <int64_t T>
struct Decoder {
  alignas(64) float w[kGroup];
  Decoder(const uint8_t* row, int64_t g) {
    const Group grp = group_at<T>(row, g);
    for (int64_t i = 0; i < kGroup; ++i) w[i] = grp.a * code_at<T>(grp, i) + grp.b;
  }
  inline Vec chunk(int64_t c) const { return Vec::loadu(w + c * kLanes); }
};

#endif

inline float sum_lanes(const Vec& v) {
  alignas(64) float lanes[kLanes];
  v.store(lanes);
  float s = 0.0f;
  for (int64_t i = 0; i < kLanes; ++i) s += lanes[i];
  return s;
}

// out[m0 + i][n0 + j] for i < MT rows of x, j < NT weight rows: each group decoded once per tile.
template <int64_t T, int MT, int NT>
inline void tile(const float* x, int64_t x_stride, const uint8_t* w, int64_t w_stride, int64_t groups,
                 const float* bias, float* out, int64_t out_stride) {
  Vec acc[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = Vec(0.0f);
  for (int64_t g = 0; g < groups; ++g) {
    // Two decoders side by side (NT <= 2): constructed per group, their scales live in registers.
    Decoder<T> dec0(w, g);
    Decoder<T> dec1(NT > 1 ? w + w_stride : w, g);
    for (int64_t c = 0; c < kChunks; ++c) {
      const Vec w0 = dec0.chunk(c);
      const Vec w1 = NT > 1 ? dec1.chunk(c) : w0;
      for (int i = 0; i < MT; ++i) {
        const Vec xv = Vec::loadu(x + i * x_stride + g * kGroup + c * kLanes);
        acc[i][0] = at::vec::fmadd(xv, w0, acc[i][0]);
        if (NT > 1) acc[i][NT - 1] = at::vec::fmadd(xv, w1, acc[i][NT - 1]);
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) out[i * out_stride + j] = sum_lanes(acc[i][j]) + (bias ? bias[j] : 0.0f);
}

template <int64_t T, int NT>
inline void rows_tile(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride,
                      const float* bias, float* out, int64_t N) {
  const int64_t groups = K / kGroup;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<T, 4, NT>(x + m * K, K, w, w_stride, groups, bias, out + m * N, N);
  switch (M - m) {
    case 3: tile<T, 3, NT>(x + m * K, K, w, w_stride, groups, bias, out + m * N, N); break;
    case 2: tile<T, 2, NT>(x + m * K, K, w, w_stride, groups, bias, out + m * N, N); break;
    case 1: tile<T, 1, NT>(x + m * K, K, w, w_stride, groups, bias, out + m * N, N); break;
    default: break;
  }
}

// Output features per thread at the least: below ~256K weight-rows of work a second thread's
// fork/join (and, on shared cores, its wait) costs more than it saves.
inline int64_t grain(int64_t M, int64_t K) {
  const int64_t work = std::max<int64_t>(1, M) * K;
  return std::max<int64_t>(2, (262144 + work - 1) / work);
}

template <int64_t T>
void linear_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride, const float* bias,
                 float* out, int64_t N) {
  const int64_t pairs = (N + 1) / 2;
  at::parallel_for(0, pairs, (grain(M, K) + 1) / 2, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = 2 * p;
      const float* b = bias ? bias + n : nullptr;
      if (n + 1 < N)
        rows_tile<T, 2>(x, M, K, w + n * w_stride, w_stride, b, out + n, N);
      else
        rows_tile<T, 1>(x, M, K, w + n * w_stride, w_stride, b, out + n, N);
    }
  });
}

void check_weight(const at::Tensor& qweight, int64_t type, int64_t K) {
  TORCH_CHECK(type == Q4_0 || type == Q4_1 || type == Q8_0 || type == Q4_K,
              "quant_linear: GGML type ", type, " is not supported (Q4_0=2, Q4_1=3, Q8_0=8, Q4_K=12)");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte && qweight.is_contiguous(),
              "quant_linear: qweight must be a contiguous 2-D uint8 tensor");
  TORCH_CHECK(K % block_weights(type) == 0, "quant_linear: in_features ", K, " is not a multiple of ",
              block_weights(type), " (the type's block)");
  TORCH_CHECK(qweight.size(1) == K / block_weights(type) * block_bytes(type), "quant_linear: a row of ", K,
              " weights of type ", type, " is ", K / block_weights(type) * block_bytes(type), " bytes, qweight has ",
              qweight.size(1));
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qweight, int64_t type,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "quant_linear: x must be 2-D float32");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = qweight.size(0);
  check_weight(qweight, type, K);
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == N, "quant_linear: bias must be float32 [N]");
  }
  at::Tensor out = at::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return out;
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  const int64_t stride = qweight.size(1);
  switch (type) {
    case Q4_0: linear_impl<Q4_0>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N); break;
    case Q4_1: linear_impl<Q4_1>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N); break;
    case Q8_0: linear_impl<Q8_0>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N); break;
    case Q4_K: linear_impl<Q4_K>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N); break;
    default: break;
  }
  return out;
}

template <int64_t T>
void rows_impl(const uint8_t* w, int64_t stride, const int64_t* ids, int64_t count, int64_t K, float* out) {
  for (int64_t t = 0; t < count; ++t) {
    const uint8_t* row = w + ids[t] * stride;
    for (int64_t g = 0; g < K / kGroup; ++g) {
      const Decoder<T> dec(row, g);
      for (int64_t c = 0; c < kChunks; ++c) dec.chunk(c).store(out + t * K + g * kGroup + c * kLanes);
    }
  }
}

at::Tensor quant_rows(const at::Tensor& qweight, int64_t type, const at::Tensor& ids, int64_t K) {
  check_weight(qweight, type, K);
  TORCH_CHECK(ids.scalar_type() == at::kLong, "quant_rows: ids must be int64");
  const at::Tensor idc = ids.contiguous();
  const int64_t count = idc.numel(), N = qweight.size(0);
  const int64_t* id = idc.data_ptr<int64_t>();
  for (int64_t t = 0; t < count; ++t)
    TORCH_CHECK(id[t] >= 0 && id[t] < N, "quant_rows: id ", id[t], " is outside [0, ", N, ")");
  at::Tensor out = at::empty({count, K}, idc.options().dtype(at::kFloat));
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  const int64_t stride = qweight.size(1);
  float* o = out.data_ptr<float>();
  switch (type) {
    case Q4_0: rows_impl<Q4_0>(w, stride, id, count, K, o); break;
    case Q4_1: rows_impl<Q4_1>(w, stride, id, count, K, o); break;
    case Q8_0: rows_impl<Q8_0>(w, stride, id, count, K, o); break;
    case Q4_K: rows_impl<Q4_K>(w, stride, id, count, K, o); break;
    default: break;
  }
  return out;
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def("quant_linear(Tensor x, Tensor qweight, int type, Tensor? bias) -> Tensor");
  m.def("quant_rows(Tensor qweight, int type, Tensor ids, int in_features) -> Tensor");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("quant_linear", &quant_linear);
  m.impl("quant_rows", &quant_rows);
}
