// Float32 activations over quantized weights: the tiles, the panels and the embedding's row lookup.
//
// Tiles (below kPanelRows rows): each group's 32 weights become float lanes in registers, are multiplied
// into the accumulators of up to four input rows at once (decoded once, used by every row of the tile)
// and dropped. Sums are float32 in lane order per group of lanes, then the lanes: not the order of a
// float32 GEMM over the dequantized weights, so results differ from that reference by rounding (~1e-6
// relative of the row's magnitude; tests/unit/kernels/test_quant_linear.py states the bound).
//
// The decoder of one group, per ISA path:
//   avx512    16 weights a vector. Q4_0/Q4_1/Q4_K/Q8_0 widen their bytes straight from memory to 32-bit
//             lanes (vpmovzx/sx), nibbles by shift and mask; the other integer types unpack the group's 32
//             codes into one 256-bit register first (quant_codes_x86.h) and widen each half. Then convert
//             and scale (one FMA, a half's own a and b where the type has 16-weight scales). F16 by
//             vcvtph2ps, BF16 by a 16-bit shift. Until Dec 2026 this path decoded each group into a stack
//             buffer and was 5-6x slower than avx2 on an AVX-512 Xeon.
//   avx2      the same, 8 weights a vector.
//   portable  each group decodes into 32 floats on the stack (quant_formats.h's plain C++), which the
//             Vectorized FMAs read.
#include <ATen/Parallel.h>

#include <vector>

#include "quant_codes_x86.h"
#include "quant_linear.h"

QUANT_BEGIN
namespace {

// Types whose avx512/avx2 decoder reads its bytes per vector from memory (measured before the others
// existed; the rest unpack a group's codes once into a register).
template <int64_t T>
constexpr bool direct() { return T == Q4_0 || T == Q4_1 || T == Q4_K || T == Q8_0; }

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)

// What a group's decoder holds on both x86 paths; each path's Decoder reads its vectors from it.
template <int64_t T>
struct GroupSource {
  Vec a0, b0, a1, b1;  // the scales of the group's halves (the same pair twice but for half_scales types)
  const uint8_t* p = nullptr;  // F16/BF16: the group's values; direct types: its code bytes
  int shift = 0;               // Q4_K: 0 (low nibbles) or 4 (high); Q4_0/Q4_1 take both of one 16-byte run
  __m256i codes;               // the other integer types: the group's codes, unpacked
  GroupSource(const uint8_t* row, int64_t g, const Scales& sc) {
    if constexpr (float_weights(T)) {
      p = row + g * kGroup * 2;
    } else {
      a0 = Vec(sc.a[0]);
      b0 = Vec(sc.b[0]);
      a1 = half_scales(T) ? Vec(sc.a[1]) : a0;
      b1 = half_scales(T) ? Vec(sc.b[1]) : b0;
      if constexpr (T == Q4_K) {
        p = block_of<T>(row, g) + 16 + 32 * ((g % 8) / 2);
        shift = static_cast<int>(4 * (g % 2));
      } else if constexpr (direct<T>()) {
        p = block_of<T>(row, g) + (T == Q4_1 ? 4 : 2);
      } else {
        codes = codes_group<T>(row, g);
      }
    }
  }
};

#endif

#if defined(CPU_CAPABILITY_AVX512)

template <int64_t T>
struct Decoder : GroupSource<T> {
  using GroupSource<T>::GroupSource;
  using GroupSource<T>::a0, GroupSource<T>::b0, GroupSource<T>::a1, GroupSource<T>::b1;
  using GroupSource<T>::p, GroupSource<T>::shift, GroupSource<T>::codes;
  inline Vec chunk(int64_t c) const {
    if constexpr (T == F16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c)));
    } else if constexpr (T == BF16) {
      const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c)));
      return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    } else {
      // A vector is a half-group here.
      return _mm512_fmadd_ps(raw(c), c == 0 ? a0 : a1, c == 0 ? b0 : b1);
    }
  }
  // Chunk c's codes as floats, unscaled (integer types only).
  inline Vec raw(int64_t c) const {
    __m512i q;
    if constexpr (T == Q8_0) {
      q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * c)));
    } else if constexpr (T == Q4_0 || T == Q4_1) {
      // Chunk 0 is the low nibbles of bytes 0-15, chunk 1 their high nibbles (no mask needed).
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      q = c == 0 ? _mm512_and_si512(bytes, _mm512_set1_epi32(0xF)) : _mm512_srli_epi32(bytes, 4);
    } else if constexpr (T == Q4_K) {
      q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * c)));
      q = _mm512_and_si512(_mm512_srl_epi32(q, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(0xF));
    } else {
      const __m128i half = c == 0 ? _mm256_castsi256_si128(codes) : _mm256_extracti128_si256(codes, 1);
      q = signed_codes(T) ? _mm512_cvtepi8_epi32(half) : _mm512_cvtepu8_epi32(half);
    }
    return _mm512_cvtepi32_ps(q);
  }
};

#elif defined(CPU_CAPABILITY_AVX2)

template <int64_t T>
struct Decoder : GroupSource<T> {
  using GroupSource<T>::GroupSource;
  using GroupSource<T>::a0, GroupSource<T>::b0, GroupSource<T>::a1, GroupSource<T>::b1;
  using GroupSource<T>::p, GroupSource<T>::shift, GroupSource<T>::codes;
  inline Vec chunk(int64_t c) const {
    if constexpr (T == F16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * c)));
    } else if constexpr (T == BF16) {
      const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * c)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    } else {
      return _mm256_fmadd_ps(raw(c), c < 2 ? a0 : a1, c < 2 ? b0 : b1);
    }
  }
  // Chunk c's codes as floats, unscaled (integer types only).
  inline Vec raw(int64_t c) const {
    __m256i q;
    if constexpr (T == Q8_0) {
      q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * c)));
    } else if constexpr (T == Q4_0 || T == Q4_1) {
      // Chunks 0-1 are the low nibbles of bytes 0-15, chunks 2-3 their high nibbles: chunks c and c + 2
      // widen the same 8 bytes (the compiler loads them once), the high nibbles need no mask.
      const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * (c & 1))));
      q = c < 2 ? _mm256_and_si256(bytes, _mm256_set1_epi32(0xF)) : _mm256_srli_epi32(bytes, 4);
    } else if constexpr (T == Q4_K) {
      q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * c)));
      q = _mm256_and_si256(_mm256_srl_epi32(q, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(0xF));
    } else {
      __m128i half = c < 2 ? _mm256_castsi256_si128(codes) : _mm256_extracti128_si256(codes, 1);
      if (c & 1) half = _mm_srli_si128(half, 8);
      q = signed_codes(T) ? _mm256_cvtepi8_epi32(half) : _mm256_cvtepu8_epi32(half);
    }
    return _mm256_cvtepi32_ps(q);
  }
};

#else

template <int64_t T>
struct Decoder {
  alignas(64) float w[kGroup];
  alignas(64) float q[kGroup];
  Decoder(const uint8_t* row, int64_t g, const Scales& sc) { weights_at<T>(row, g, sc, w, q); }
  inline Vec chunk(int64_t c) const { return Vec::loadu(w + c * kLanes); }
  inline Vec raw(int64_t c) const { return Vec::loadu(q + c * kLanes); }
};

#endif

// out[m0 + i][n0 + j] for i < MT rows of x, j < NT weight rows: each group decoded once per tile.
// The scales are factored out of the products: a group's weights are a * code + b (per half-group), so
// its share of a dot product is a * sum(code * x) + b * sum(x). The codes meet x as unscaled floats, a
// multiplies one vector per (row, group) and half, and b meets the half's sum of x (`xsum`, computed
// once per call) as a scalar. At one row this is half the vector work of scaling every weight first
// (the a * code + b of each lane was an FMA per 8 or 16 weights and output); from four rows on the two
// cost the same. Every row of a tile is summed in the same order whatever MT is, so a row's result does
// not depend on how many rows the call has (below the panel path).
template <int64_t T, int MT, int NT>
inline void tile(const float* x, int64_t x_stride, const float* xsum, const uint8_t* w, int64_t w_stride,
                 int64_t groups, const float* bias, float* out, int64_t out_stride) {
  constexpr int64_t half = kChunks / 2;  // vectors per half-group
  Vec acc[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = Vec(0.0f);
  ScaleReader<T> scales0(w), scales1(w + (NT > 1 ? w_stride : 0));
  for (int64_t g = 0; g < groups; ++g) {
    for (int j = 0; j < NT; ++j) {
      const Scales sc = (j == 0 ? scales0 : scales1).at(g);
      prefetch_ahead(block_of<T>(w + j * w_stride, g));
      const Decoder<T> dec(w + j * w_stride, g, sc);
      if constexpr (float_weights(T)) {
        for (int64_t c = 0; c < kChunks; ++c) {
          const Vec wv = dec.chunk(c);
          for (int i = 0; i < MT; ++i)
            acc[i][j] = at::vec::fmadd(Vec::loadu(x + i * x_stride + g * kGroup + c * kLanes), wv, acc[i][j]);
        }
      } else {
        Vec q[kChunks];
        for (int64_t c = 0; c < kChunks; ++c) q[c] = dec.raw(c);
        for (int i = 0; i < MT; ++i) {
          const float* xg = x + i * x_stride + g * kGroup;
          if constexpr (half_scales(T)) {  // a scale per half: a dot product per half
            Vec d0 = q[0] * Vec::loadu(xg), d1 = q[half] * Vec::loadu(xg + half * kLanes);
            for (int64_t c = 1; c < half; ++c) {
              d0 = at::vec::fmadd(q[c], Vec::loadu(xg + c * kLanes), d0);
              d1 = at::vec::fmadd(q[half + c], Vec::loadu(xg + (half + c) * kLanes), d1);
            }
            acc[i][j] = at::vec::fmadd(d1, Vec(sc.a[1]), at::vec::fmadd(d0, Vec(sc.a[0]), acc[i][j]));
          } else {
            Vec d = q[0] * Vec::loadu(xg);
            for (int64_t c = 1; c < kChunks; ++c) d = at::vec::fmadd(q[c], Vec::loadu(xg + c * kLanes), d);
            acc[i][j] = at::vec::fmadd(d, Vec(sc.a[0]), acc[i][j]);
          }
        }
      }
    }
  }
  // The offsets, in a pass of their own over the scales (a scalar accumulator per (row, output) in the
  // loop above would take the registers the vectors need).
  float offset[MT][NT] = {};
  if constexpr (!float_weights(T)) {
    for (int j = 0; j < NT; ++j) {
      ScaleReader<T> scales(w + j * w_stride);
      for (int64_t g = 0; g < groups; ++g) {
        const Scales sc = scales.at(g);
        for (int i = 0; i < MT; ++i) {
          const float* xs = xsum + i * 2 * groups + 2 * g;
          offset[i][j] += sc.b[0] * xs[0] + sc.b[1] * xs[1];
        }
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j)
      out[i * out_stride + j] = sum_lanes(acc[i][j]) + offset[i][j] + (bias ? bias[j] : 0.0f);
}

template <int64_t T, int NT>
inline void rows_tile(const float* x, int64_t M, int64_t K, const float* xsum, const uint8_t* w,
                      int64_t w_stride, const float* bias, float* out, int64_t N) {
  const int64_t groups = K / kGroup;
  int64_t m = 0;
  const auto at_row = [&](int64_t r) { return xsum + r * 2 * groups; };
  for (; m + 4 <= M; m += 4) tile<T, 4, NT>(x + m * K, K, at_row(m), w, w_stride, groups, bias, out + m * N, N);
  switch (M - m) {
    case 3: tile<T, 3, NT>(x + m * K, K, at_row(m), w, w_stride, groups, bias, out + m * N, N); break;
    case 2: tile<T, 2, NT>(x + m * K, K, at_row(m), w, w_stride, groups, bias, out + m * N, N); break;
    case 1: tile<T, 1, NT>(x + m * K, K, at_row(m), w, w_stride, groups, bias, out + m * N, N); break;
    default: break;
  }
}

// Each half-group's sum of x, [M][2 * groups]: what the weights' offsets b multiply.
inline std::vector<float> half_sums(const float* x, int64_t M, int64_t K) {
  std::vector<float> sums(M * (K / 16));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < K / 16; ++h) {
      Vec v = Vec::loadu(x + m * K + h * 16);
      if constexpr (kLanes < 16)
        for (int64_t c = 1; c < 16 / kLanes; ++c) v = v + Vec::loadu(x + m * K + h * 16 + c * kLanes);
      sums[m * (K / 16) + h] = sum_lanes(v);
    }
  return sums;
}

template <int64_t T>
void tiles_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride, const float* bias,
                float* out, int64_t N) {
  const std::vector<float> xsum = float_weights(T) ? std::vector<float>() : half_sums(x, M, K);
  const int64_t pairs = (N + 1) / 2;
  at::parallel_for(0, pairs, (grain(M, K) + 1) / 2, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = 2 * p;
      const float* b = bias ? bias + n : nullptr;
      if (n + 1 < N)
        rows_tile<T, 2>(x, M, K, xsum.data(), w + n * w_stride, w_stride, b, out + n, N);
      else
        rows_tile<T, 1>(x, M, K, xsum.data(), w + n * w_stride, w_stride, b, out + n, N);
    }
  });
}

// Row `row` (K weights in groups) decoded into out[0, K).
template <int64_t T>
inline void decode_row(const uint8_t* row, int64_t K, float* out) {
  ScaleReader<T> scales(row);
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const Decoder<T> dec(row, g, scales.at(g));
    for (int64_t c = 0; c < kChunks; ++c) dec.chunk(c).store(out + g * kGroup + c * kLanes);
  }
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
constexpr int64_t kPanelBytes = 4096 * 1024;

template <int64_t T>
void panels_impl(const at::Tensor& x, const uint8_t* w, int64_t stride, const at::Tensor& bias, at::Tensor& out) {
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

}  // namespace

void linear_tiles(int64_t type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride,
                  const float* bias, float* out, int64_t N) {
  with_type(type, [&](auto t) { tiles_impl<decltype(t)::value>(x, M, K, w, w_stride, bias, out, N); });
}

void linear_panels(int64_t type, const at::Tensor& x, const uint8_t* w, int64_t w_stride, const at::Tensor& bias,
                   at::Tensor& out) {
  with_type(type, [&](auto t) { panels_impl<decltype(t)::value>(x, w, w_stride, bias, out); });
}

void decode_rows(int64_t type, const uint8_t* w, int64_t w_stride, const int64_t* ids, int64_t count, int64_t K,
                 float* out) {
  with_type(type, [&](auto t) {
    for (int64_t i = 0; i < count; ++i) decode_row<decltype(t)::value>(w + ids[i] * w_stride, K, out + i * K);
  });
}

QUANT_END
