// Linear layers and embedding lookups over GGUF-quantized weights, kept in their stored blocks.
//
//   quant_linear(x [M, K] float32, qweight [N, row_bytes] uint8, int type, bias?, int mode=0) -> [M, N] float32
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
// weight where float32 reads 4. Below kPanelRows rows the weights are decoded inside the dot products
// and never written back out; from there a panel of rows at a time is decoded into a scratch buffer
// for a float32 GEMM (the panel path, below).
//
// mode 0 (the default), float32 activations: each group's 32 codes become float lanes, are multiplied
// into the accumulators of up to four input rows at once (read once, used by every row of the tile)
// and dropped. Sums are float32 in lane order per group of lanes, then the lanes: not the order of a
// float32 GEMM over the dequantized weights, so results differ from that reference by rounding (~1e-6
// relative of the row's magnitude; tests/unit/kernels/test_quant_linear.py states the bound).
//
// modes 1-3, int8 activations (1: from kIntRows = 8 rows on, float below; 2: always; 3: always,
// without VNNI): each activation row is quantized once per call to int8 per 32-block (scale max|x|/127,
// and the block's code sum for the formats with an offset b), then per weight group an integer dot
// product of its codes with the row's int8 block, and a * sx * dot + b * sx * sum(q) in float. This is
// what llama.cpp does (its Q8_0/Q8_1 activations), so it is the fair comparison with it; it moves each
// output by up to (max|x| of each block / 254) * sum|w| of the block (~0.5% relative on the tiny
// models' linears), which flips greedy near-ties: on the bundled SmolLM2 3 of 8 16-token greedy
// outputs stayed equal to the float32 reference's where the float path holds 7 of 8. So it is opt-in
// (the worker: PAGEDSERVE_QUANT_ACTIVATIONS=int8). At 64 rows the compute-bound step has fewer
// instructions per product: 4 per 64 multiply-adds (vpdpbusd, cvt, scale mul, FMA) against the float
// path's 4 FMAs per 64 plus the per-tile decode (widen, shift, mask, cvt, FMA per 16 codes).
//
// One source, three ISA paths (kernels/cpu/isa.py), over ATen's at::vec::Vectorized<float>:
//   avx512    float: each 16 codes widen from bytes to 32-bit lanes (vpmovzx/sx), nibbles by shift and
//             mask, converted and scaled in registers (one FMA). Until Dec 2026 this path decoded
//             each group into a stack buffer and was 5-6x slower than avx2 on an AVX-512 Xeon.
//             int8: two groups per 512-bit register, vpdpbusd (by inline assembly, where the CPU has
//             avx512_vnni: checked at run time, since the build names no VNNI flag; else
//             vpmaddubsw + vpmaddwd); Q8_0's signed codes +128 under VNNI (the 128 * sum(q) comes
//             back through b), |code| and the sign moved onto x without it. 8 rows x 2 outputs a tile.
//   avx2      float: the same 8 codes at a time. int8: one group per 256-bit register, vpmaddubsw +
//             vpmaddwd (no VNNI needed: the EPYC Zen 3 has none), Q8_0 by vpsignb. 4 x 2 a tile.
//   portable  float: each group decodes into a 32-float buffer on the stack which the Vectorized FMAs
//             read. int8: a plain C++ integer dot per group (no intrinsics; the compiler vectorizes).
// Every path reads fp16 scales with F16C where it has it (x86 paths), c10's conversion otherwise.
// Measured on an Intel Xeon with AVX-512/VNNI (2 shared cores, busy; 1 thread, min of 5,
// ops/microbench/quant_linear_ab.py): see docs/cpu-performance.md.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Half.h>
#include "library.h"
#include <torch/types.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

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

// ---------------------------------------------------------------------------------------------------
// The integer path (large row counts): each activation row is quantized once per call to int8 per
// 32-element block, q = round(x * 127 / max|x|), scale sx = max|x| / 127 (llama.cpp's Q8_0/Q8_1 of the
// activations). Per weight group and row: an integer dot product of the group's codes with the row's
// int8 block, then sum += a * sx * dot + b * sx * sum(q) in float. The b term (the groups' offsets) is a
// float dot product over groups, done once per (row, output) after the main loop.

// The activation rows, quantized. Groups are padded to a multiple of 16 with zeros (codes, scales, sums),
// so a pair of groups (avx512) or a vector of per-group sums never reads past a row.
struct QuantX {
  std::vector<int8_t> q;    // [M][Gp * 32]
  std::vector<float> sx8;   // [M][Gp * 8]: each group's scale, 8 copies (one per int32 lane of its dot)
  std::vector<float> sxs;   // [M][Gp]: scale * the sum of the group's codes
  int64_t G, Gp;
};

inline int64_t padded_groups(int64_t G) { return (G + 15) / 16 * 16; }

QuantX quantize_x(const float* x, int64_t M, int64_t K) {
  QuantX xq;
  xq.G = K / kGroup;
  xq.Gp = padded_groups(xq.G);
  xq.q.assign(M * xq.Gp * kGroup, 0);
  xq.sx8.assign(M * xq.Gp * 8, 0.0f);
  xq.sxs.assign(M * xq.Gp, 0.0f);
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / K), [&](int64_t begin, int64_t end) {
    alignas(64) float scaled[kGroup];
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t g = 0; g < xq.G; ++g) {
        const float* xs = x + m * K + g * kGroup;
        Vec amax(0.0f);
        for (int64_t c = 0; c < kChunks; ++c) amax = at::vec::maximum(amax, Vec::loadu(xs + c * kLanes).abs());
        alignas(64) float lanes[kLanes];
        amax.store(lanes);
        float mx = 0.0f;
        for (int64_t i = 0; i < kLanes; ++i) mx = std::max(mx, lanes[i]);
        const float d = mx / 127.0f, id = mx > 0.0f ? 127.0f / mx : 0.0f;
        for (int64_t c = 0; c < kChunks; ++c) (Vec::loadu(xs + c * kLanes) * Vec(id)).round().store(scaled + c * kLanes);
        int8_t* q = xq.q.data() + (m * xq.Gp + g) * kGroup;
        int sum = 0;
        for (int64_t i = 0; i < kGroup; ++i) {
          const int v = static_cast<int>(scaled[i]);
          q[i] = static_cast<int8_t>(v);
          sum += v;
        }
        for (int i = 0; i < 8; ++i) xq.sx8[(m * xq.Gp + g) * 8 + i] = d;
        xq.sxs[m * xq.Gp + g] = d * static_cast<float>(sum);
      }
    }
  });
  return xq;
}

// How each path feeds Q8_0's signed codes to an unsigned-by-signed byte product: avx512 with VNNI adds
// 128 (code ^ 0x80, unsigned) and takes 128 * a * sx * sum(q) back through the b term; the others take
// |code| and move its sign onto the activation (vpsignb / a masked negate), b = 0.
enum class Q8 { kSigned, kOffset };

// One weight row's per-group a (8 copies, like sx8) and b, padded like QuantX.
template <int64_t T, Q8 q8>
void weight_scales(const uint8_t* row, int64_t G, float* a8, float* b) {
  for (int64_t g = 0; g < G; ++g) {
    const Group grp = group_at<T>(row, g);
    for (int i = 0; i < 8; ++i) a8[g * 8 + i] = grp.a;
    b[g] = T == Q8_0 ? (q8 == Q8::kOffset ? -128.0f * grp.a : 0.0f) : grp.b;
  }
  std::fill(a8 + G * 8, a8 + padded_groups(G) * 8, 0.0f);
  std::fill(b + G, b + padded_groups(G), 0.0f);
}

// sum_g b[g] * sxs[g] over padded groups (a multiple of 16: whole vectors).
inline float offset_term(const float* b, const float* sxs, int64_t Gp) {
  Vec acc(0.0f);
  for (int64_t g = 0; g < Gp; g += kLanes) acc = at::vec::fmadd(Vec::loadu(b + g), Vec::loadu(sxs + g), acc);
  return sum_lanes(acc);
}

// Whether the b term is needed: every format but Q8_0 has an offset; Q8_0 only through the +128 trick.
template <int64_t T, Q8 q8>
constexpr bool has_offset() { return T != Q8_0 || q8 == Q8::kOffset; }

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

// The lane sums of 8 vectors at once, as one vector: a tree of hadds instead of 8 separate reductions.
inline __m256 sum8(const __m256* v) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// out[i][j] = the lane sum of v[i * NT + j] (+ bias[j]), for a tile's MT x NT accumulators.
template <int MT, int NT>
inline void store_sums(__m256* v, const float* bias, float* out, int64_t out_stride) {
  constexpr int n = MT * NT, padded = (n + 7) / 8 * 8;
  for (int k = n; k < padded; ++k) v[k] = _mm256_setzero_ps();
  alignas(32) float sums[padded];
  for (int k = 0; k < padded; k += 8) _mm256_store_ps(sums + k, sum8(v + k));
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) out[i * out_stride + j] = sums[i * NT + j] + (bias ? bias[j] : 0.0f);
}

#endif

#if defined(CPU_CAPABILITY_AVX512)

// Groups g and g+1 (g even; g+1 only where `pair`) as 64 unsigned (Q8_0: signed, or offset) bytes in
// code order: bytes 0-31 group g, 32-63 group g+1, matching the activations' layout.
template <int64_t T, Q8 q8>
inline __m512i codes_pair(const uint8_t* row, int64_t g, bool pair) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  if constexpr (T == Q8_0) {
    const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + g * 34 + 2));
    const __m256i c1 = pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (g + 1) * 34 + 2))
                            : _mm256_setzero_si256();
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
    return q8 == Q8::kOffset ? _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))) : w;
  } else if constexpr (T == Q4_K) {
    // Groups 2k and 2k+1 of a super-block share 32 bytes: low nibbles, high nibbles.
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (g / 8) * 144 + 16 + 16 * (g % 8)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, nib)),
                              _mm256_and_si256(_mm256_srli_epi16(v, 4), nib), 1);
  } else {
    constexpr int64_t off = T == Q4_0 ? 2 : 4, bb = block_bytes(T);
    const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * bb + off));
    const __m128i c1 = pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + (g + 1) * bb + off))
                            : _mm_setzero_si128();
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(c0), c1, 1);
    // [g lo, g+1 lo, g hi, g+1 hi] in 128-bit lanes, then lanes 0 2 1 3: each group's low nibbles
    // (codes 0-15) before its high ones (16-31).
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, nib)),
                                         _mm256_and_si256(_mm256_srli_epi16(v, 4), nib), 1);
    return _mm512_shuffle_i64x2(w, w, _MM_SHUFFLE(3, 1, 2, 0));
  }
}

// 16 int32 lanes, each the sum of 4 products of unsigned w bytes by signed x bytes.
template <bool VNNI>
inline __m512i dot_u8s8(__m512i w, __m512i x) {
  if constexpr (VNNI) {
    // vpdpbusd by inline assembly: the avx512 build names no VNNI flag (it must load on every AVX-512
    // CPU), and this is only reached where the CPU has avx512_vnni (checked at run time).
    __m512i acc = _mm512_setzero_si512();
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
    return acc;
  } else {
    // maddubs: pairs of products summed to int16 (at most 2 * 15 * 127, or 2 * 128 * 127 for |Q8_0|)
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
  }
}

template <int64_t T, int MT, int NT, bool VNNI>
inline void int_tile(const QuantX& xq, int64_t m0, const uint8_t* w, int64_t w_stride, const float* a8,
                     const float* bsc, const float* bias, float* out, int64_t out_stride) {
  constexpr Q8 q8 = VNNI ? Q8::kOffset : Q8::kSigned;
  constexpr bool sign_x = T == Q8_0 && q8 == Q8::kSigned;
  const int64_t G = xq.G, Gp = xq.Gp;
  __m512 acc[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t g = 0; g < G; g += 2) {
    __m512i wc[NT];
    __mmask64 neg[NT];
    __m512 a[NT];
    for (int j = 0; j < NT; ++j) {
      wc[j] = codes_pair<T, q8>(w + j * w_stride, g, g + 1 < G);
      if constexpr (sign_x) {
        neg[j] = _mm512_movepi8_mask(wc[j]);
        wc[j] = _mm512_abs_epi8(wc[j]);
      }
      a[j] = _mm512_loadu_ps(a8 + j * Gp * 8 + g * 8);
    }
    for (int i = 0; i < MT; ++i) {
      const __m512i x = _mm512_loadu_si512(xq.q.data() + ((m0 + i) * Gp + g) * kGroup);
      const __m512 sx = _mm512_loadu_ps(xq.sx8.data() + ((m0 + i) * Gp + g) * 8);
      for (int j = 0; j < NT; ++j) {
        const __m512i xj = sign_x ? _mm512_mask_sub_epi8(x, neg[j], zero, x) : x;
        const __m512 dot = _mm512_cvtepi32_ps(dot_u8s8<VNNI>(wc[j], xj));
        acc[i][j] = _mm512_fmadd_ps(dot, _mm512_mul_ps(a[j], sx), acc[i][j]);
      }
    }
  }
  // The b term joins the accumulators lane by lane (only their total matters), then one tree reduction.
  __m256 halves[(MT * NT + 7) / 8 * 8];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) {
      __m512 v = acc[i][j];
      if constexpr (has_offset<T, q8>())
        for (int64_t g = 0; g < Gp; g += 16)
          v = _mm512_fmadd_ps(_mm512_loadu_ps(bsc + j * Gp + g), _mm512_loadu_ps(xq.sxs.data() + (m0 + i) * Gp + g), v);
      halves[i * NT + j] = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    }
  store_sums<MT, NT>(halves, bias, out, out_stride);
}

#elif defined(CPU_CAPABILITY_AVX2)

// Group g's 32 codes as unsigned bytes in code order (Q8_0: the signed codes as stored).
template <int64_t T>
inline __m256i codes_group(const uint8_t* row, int64_t g) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  if constexpr (T == Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + g * 34 + 2));
  } else if constexpr (T == Q4_K) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (g / 8) * 144 + 16 + 32 * ((g % 8) / 2)));
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(static_cast<int>(4 * (g % 2)))), nib);
  } else {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * block_bytes(T) + (T == Q4_0 ? 2 : 4)));
    return _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(c), _mm_srli_epi16(c, 4), 1), nib);
  }
}

// maddubs + madd (AVX2 has no VNNI on the EPYC Zen 3 this path serves): 8 int32 lanes of 4 products.
template <int64_t T, int MT, int NT, bool VNNI>
inline void int_tile(const QuantX& xq, int64_t m0, const uint8_t* w, int64_t w_stride, const float* a8,
                     const float* bsc, const float* bias, float* out, int64_t out_stride) {
  const int64_t G = xq.G, Gp = xq.Gp;
  __m256 acc[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < G; ++g) {
    __m256i wc[NT], wabs[NT];
    __m256 a[NT];
    for (int j = 0; j < NT; ++j) {
      wc[j] = codes_group<T>(w + j * w_stride, g);
      wabs[j] = T == Q8_0 ? _mm256_abs_epi8(wc[j]) : wc[j];
      a[j] = _mm256_loadu_ps(a8 + j * Gp * 8 + g * 8);
    }
    for (int i = 0; i < MT; ++i) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q.data() + ((m0 + i) * Gp + g) * kGroup));
      const __m256 sx = _mm256_loadu_ps(xq.sx8.data() + ((m0 + i) * Gp + g) * 8);
      for (int j = 0; j < NT; ++j) {
        const __m256i xj = T == Q8_0 ? _mm256_sign_epi8(x, wc[j]) : x;
        const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[j], xj), ones);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(a[j], sx), acc[i][j]);
      }
    }
  }
  __m256 sums[(MT * NT + 7) / 8 * 8];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) {
      __m256 v = acc[i][j];
      if constexpr (T != Q8_0)
        for (int64_t g = 0; g < Gp; g += 8)
          v = _mm256_fmadd_ps(_mm256_loadu_ps(bsc + j * Gp + g), _mm256_loadu_ps(xq.sxs.data() + (m0 + i) * Gp + g), v);
      sums[i * NT + j] = v;
    }
  store_sums<MT, NT>(sums, bias, out, out_stride);
}

#else

// Plain C++ (no intrinsics): the compiler vectorizes the 32-product integer dot where it can.
template <int64_t T, int MT, int NT, bool VNNI>
inline void int_tile(const QuantX& xq, int64_t m0, const uint8_t* w, int64_t w_stride, const float* a8,
                     const float* bsc, const float* bias, float* out, int64_t out_stride) {
  const int64_t G = xq.G, Gp = xq.Gp;
  float acc[MT][NT] = {};
  int16_t codes[NT][kGroup];
  for (int64_t g = 0; g < G; ++g) {
    for (int j = 0; j < NT; ++j) {
      const Group grp = group_at<T>(w + j * w_stride, g);
      for (int64_t k = 0; k < kGroup; ++k) codes[j][k] = static_cast<int16_t>(code_at<T>(grp, k));
    }
    for (int i = 0; i < MT; ++i) {
      const int8_t* x = xq.q.data() + ((m0 + i) * Gp + g) * kGroup;
      const float sx = xq.sx8[((m0 + i) * Gp + g) * 8];
      for (int j = 0; j < NT; ++j) {
        int32_t dot = 0;
        for (int64_t k = 0; k < kGroup; ++k) dot += static_cast<int32_t>(codes[j][k]) * x[k];
        acc[i][j] += a8[j * Gp * 8 + g * 8] * sx * static_cast<float>(dot);
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) {
      float s = acc[i][j] + (bias ? bias[j] : 0.0f);
      if constexpr (T != Q8_0) s += offset_term(bsc + j * Gp, xq.sxs.data() + (m0 + i) * Gp, Gp);
      out[i * out_stride + j] = s;
    }
}

#endif

// Which Q8_0 form each path's int_tile reads its b from (see Q8).
template <bool VNNI>
constexpr Q8 q8_form() {
#if defined(CPU_CAPABILITY_AVX512)
  return VNNI ? Q8::kOffset : Q8::kSigned;
#else
  return Q8::kSigned;
#endif
}

template <int64_t T, int NT, bool VNNI>
inline void int_rows(const QuantX& xq, int64_t M, const uint8_t* w, int64_t w_stride, const float* a8,
                     const float* bsc, const float* bias, float* out, int64_t N) {
  int64_t m = 0;
#if defined(CPU_CAPABILITY_AVX512)
  // 8 rows a tile (16 accumulators of the 32 registers): each decoded pair of groups serves 8 rows.
  for (; m + 8 <= M; m += 8) int_tile<T, 8, NT, VNNI>(xq, m, w, w_stride, a8, bsc, bias, out + m * N, N);
#endif
  for (; m + 4 <= M; m += 4) int_tile<T, 4, NT, VNNI>(xq, m, w, w_stride, a8, bsc, bias, out + m * N, N);
  switch (M - m) {
    case 3: int_tile<T, 3, NT, VNNI>(xq, m, w, w_stride, a8, bsc, bias, out + m * N, N); break;
    case 2: int_tile<T, 2, NT, VNNI>(xq, m, w, w_stride, a8, bsc, bias, out + m * N, N); break;
    case 1: int_tile<T, 1, NT, VNNI>(xq, m, w, w_stride, a8, bsc, bias, out + m * N, N); break;
    default: break;
  }
}

template <int64_t T, bool VNNI>
void linear_int_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride, const float* bias,
                     float* out, int64_t N) {
  constexpr Q8 q8 = q8_form<VNNI>();
  const QuantX xq = quantize_x(x, M, K);
  const int64_t Gp = xq.Gp;
  const int64_t pairs = (N + 1) / 2;
  at::parallel_for(0, pairs, (grain(M, K) + 1) / 2, [&](int64_t begin, int64_t end) {
    std::vector<float> a8(2 * Gp * 8), bsc(2 * Gp);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = 2 * p;
      const int nt = n + 1 < N ? 2 : 1;
      for (int j = 0; j < nt; ++j)
        weight_scales<T, q8>(w + (n + j) * w_stride, xq.G, a8.data() + j * Gp * 8, bsc.data() + j * Gp);
      const float* b = bias ? bias + n : nullptr;
      if (nt == 2)
        int_rows<T, 2, VNNI>(xq, M, w + n * w_stride, w_stride, a8.data(), bsc.data(), b, out + n, N);
      else
        int_rows<T, 1, VNNI>(xq, M, w + n * w_stride, w_stride, a8.data(), bsc.data(), b, out + n, N);
    }
  });
}

// Whether this CPU runs vpdpbusd (avx512 path only; the build itself never assumes it).
inline bool cpu_has_vnni() {
#if defined(CPU_CAPABILITY_AVX512)
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
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

// Rows from which `mode` 1 runs the integer path (measured: see the header comment).
constexpr int64_t kIntRows = 8;

// Rows from which mode 0 runs the panel path (measured: see the panel path's comment).
constexpr int64_t kPanelRows = 24;

template <int64_t T>
void linear_dispatch(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t stride, const float* bias,
                     float* out, int64_t N, int64_t mode) {
  const bool integer = mode == 2 || mode == 3 || (mode == 1 && M >= kIntRows);
  if (!integer)
    linear_impl<T>(x, M, K, w, stride, bias, out, N);
  else if (mode != 3 && cpu_has_vnni())
    linear_int_impl<T, true>(x, M, K, w, stride, bias, out, N);
  else
    linear_int_impl<T, false>(x, M, K, w, stride, bias, out, N);
}

// ---------------------------------------------------------------------------------------------------
// The panel path (mode 0 from kPanelRows rows on). A tile above decodes each weight group once per 4
// input rows, so at 64 rows every weight is decoded 16 times and the step is bound by the decoding,
// not by memory: 2.5x slower than a float32 GEMM over the dequantized weights (bundled SmolLM2's
// linears, 64 rows, 2 threads). Here a panel of output rows (<= kPanelBytes of float32, at least 64
// rows) is decoded once into a scratch buffer and one float32 GEMM (ATen's mm, MKL or oneDNN)
// multiplies it into its columns of the output. The model stays quantized in memory: the scratch is
// one buffer per calling thread, reused by every call, and no matrix is ever dequantized whole
// (4 MiB panels measured faster than 512 KiB ones: fewer, larger GEMMs). Results are the float32
// GEMM's over the dequantized weights: float rounding apart from the tile path.

// Row `row` (K weights in groups) decoded into out[0, K).
template <int64_t T>
inline void decode_row(const uint8_t* row, int64_t K, float* out) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const Decoder<T> dec(row, g);
    for (int64_t c = 0; c < kChunks; ++c) dec.chunk(c).store(out + g * kGroup + c * kLanes);
  }
}

constexpr int64_t kPanelBytes = 4096 * 1024;

template <int64_t T>
void linear_panels(const at::Tensor& x, const uint8_t* w, int64_t stride, const at::Tensor& bias, at::Tensor& out) {
  const int64_t K = x.size(1), N = out.size(1);
  const int64_t rows = std::min(N, std::max<int64_t>(64, kPanelBytes / (K * static_cast<int64_t>(sizeof(float)))));
  // One scratch per calling thread, kept: a fresh 4 MB buffer a call would fault its pages in anew
  // (120 linears a step).
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(rows * K)) scratch.resize(rows * K);
  float* pp = scratch.data();
  const at::Tensor panel = at::from_blob(pp, {rows, K}, x.options());
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t nr = std::min(rows, N - n0);
    at::parallel_for(0, nr, std::max<int64_t>(1, 32768 / K), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) decode_row<T>(w + (n0 + r) * stride, K, pp + r * K);
    });
    at::Tensor o = out.narrow(1, n0, nr);  // strides (N, 1): BLAS writes it in place
    const at::Tensor wt = panel.narrow(0, 0, nr).t();
    if (bias.defined())
      at::addmm_out(o, bias.narrow(0, n0, nr), x, wt);
    else
      at::mm_out(o, x, wt);
  }
}

// mode: 0 float32 activations (the default: results within float rounding of the dequantized
// reference; tiles below kPanelRows rows, panels from there), 1 int8 activations from kIntRows rows on
// (float below), 2 int8 activations at any row count, 3 int8 activations without VNNI (avx512's
// maddubs form, which the tests run on a VNNI CPU too), 4 float32 tiles and 5 float32 panels at any
// row count (tests and A/B runs of the two float paths).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qweight, int64_t type,
                        const c10::optional<at::Tensor>& bias, int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= 5, "quant_linear: mode must be 0-5, got ", mode);
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
  if (mode == 5 || (mode == 0 && M >= kPanelRows)) {
    switch (type) {
      case Q4_0: linear_panels<Q4_0>(xc, w, stride, b, out); break;
      case Q4_1: linear_panels<Q4_1>(xc, w, stride, b, out); break;
      case Q8_0: linear_panels<Q8_0>(xc, w, stride, b, out); break;
      case Q4_K: linear_panels<Q4_K>(xc, w, stride, b, out); break;
      default: break;
    }
    return out;
  }
  switch (type) {
    case Q4_0: linear_dispatch<Q4_0>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N, mode); break;
    case Q4_1: linear_dispatch<Q4_1>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N, mode); break;
    case Q8_0: linear_dispatch<Q8_0>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N, mode); break;
    case Q4_K: linear_dispatch<Q4_K>(xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N, mode); break;
    default: break;
  }
  return out;
}

template <int64_t T>
void rows_impl(const uint8_t* w, int64_t stride, const int64_t* ids, int64_t count, int64_t K, float* out) {
  for (int64_t t = 0; t < count; ++t) decode_row<T>(w + ids[t] * stride, K, out + t * K);
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
  m.def("quant_linear(Tensor x, Tensor qweight, int type, Tensor? bias, int mode=0) -> Tensor");
  m.def("quant_rows(Tensor qweight, int type, Tensor ids, int in_features) -> Tensor");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("quant_linear", &quant_linear);
  m.impl("quant_rows", &quant_rows);
}
