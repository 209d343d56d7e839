// Int8 activations over quantized weights (quant_linear's modes 1-3): each activation row is quantized
// once per call to int8 per 32-element block, q = round(x * 127 / max|x|), scale sx = max|x| / 127
// (llama.cpp's Q8_0/Q8_1 of the activations). Per weight group and row: an integer dot product of the
// group's codes with the row's int8 block, then sum += a * sx * dot + b * sx * sum(q) in float. The int32
// lanes of a dot each sum 4 neighbouring products, so lanes 0-3 are a group's first half and 4-7 its
// second: a type with a scale per 16 weights (Q2_K, Q3_K, Q6_K) just gives the two halves' lanes their
// own a. The b term (the offsets, per half) is a float dot product over half-groups, done once per
// (row, output) after the main loop.
//
//   avx512    two groups per 512-bit register, vpdpbusd (by inline assembly, where the CPU has
//             avx512_vnni: checked at run time, since the build names no VNNI flag; else
//             vpmaddubsw + vpmaddwd); signed codes (Q8_0, IQ4) +128 under VNNI (the 128 * sum(q) comes
//             back through b), |code| and the sign moved onto x without it. 8 rows x 2 outputs a tile.
//   avx2      one group per 256-bit register, vpmaddubsw + vpmaddwd (no VNNI needed: the EPYC Zen 3 has
//             none), signed codes by vpsignb. 4 x 2 a tile. Its scales come from each group's block as
//             it goes and its b term is a scalar per (row, output) in group order (see its int_tile).
//             Q4_0 and Q4_1 take two groups per register instead (pair_tile; from 16 rows each output's
//             pairs decoded once into a panel that every row tile reads, panel_tile), and the K-quants
//             with unsigned codes a super-block at a time (superblock_tile).
//   portable  a plain C++ integer dot per half-group (no intrinsics; the compiler vectorizes).
// vpmaddubsw sums two products into int16 with saturation: at most 2 * 63 * 127 (Q6_K) or 2 * 128 * 127
// (|Q8_0|), both below 32767.
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "int8_rows.h"
#include "quant_codes_x86.h"
#include "quant_linear.h"

QUANT_BEGIN
namespace {

// The activation rows, quantized. Groups are padded to a multiple of 16 with zeros (codes, scales, sums),
// so a pair of groups (avx512) or a vector of per-group sums never reads past a row.
struct QuantX {
  std::vector<int8_t> q;    // [M][Gp * 32]
  std::vector<float> sx8;   // [M][Gp * 8]: each group's scale, 8 copies (one per int32 lane of its dot)
  std::vector<float> sxs;   // [M][Gp * 2]: scale * the sum of each half-group's codes
  std::vector<float> sxg;   // [M][Gp]: scale * the sum of the group's codes (one offset per group)
  std::vector<float> sx;    // [M][Gp]: each group's scale, once (the avx2 super-block tiles read 4 at a time)
  // [M][Gp][16], only for a weight type with a constant code offset c (code_offset): c * the sum of
  // each pair of neighbouring codes, what vpmaddubsw's int16 lanes lose to the offset.
  std::vector<int16_t> xoff;
  int64_t G, Gp;
};

// The types with a constant code offset (quant_formats.h's code_offset): their b term is -c * a, so the
// avx2 tiles subtract c * x from each pair of products in int16 (one vpsubw) instead of adding b * sx *
// sum(q) in float per (group, output) (three scalar operations), as the types with a free minimum (Q4_1,
// the K-quants' mins) still do. (Q3_K's 4 and Q6_K's 32 are not listed: on avx2 the K-quants take the
// super-block tiles, whose offsets all join through b.)

inline int64_t padded_groups(int64_t G) { return (G + 15) / 16 * 16; }

// offset * (q[2i] + q[2i + 1]) for the 16 pairs of a group's codes: what vpmaddubsw's int16 lanes lose to
// a constant code offset (code_offset).
inline void offset_pairs(const int8_t* q, int offset, int16_t* pairs) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  const __m256i sums = _mm256_maddubs_epi16(_mm256_set1_epi8(1), load256(reinterpret_cast<const uint8_t*>(q)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs), _mm256_mullo_epi16(sums, _mm256_set1_epi16(offset)));
#else
  for (int64_t i = 0; i < 16; ++i) pairs[i] = static_cast<int16_t>(offset * (q[2 * i] + q[2 * i + 1]));
#endif
}

QuantX quantize_x(const float* x, int64_t M, int64_t K, int offset = 0) {
  QuantX xq;
  xq.G = K / kGroup;
  xq.Gp = padded_groups(xq.G);
  xq.q.assign(M * xq.Gp * kGroup, 0);
  xq.sx8.assign(M * xq.Gp * 8, 0.0f);
  xq.sxs.assign(M * xq.Gp * 2, 0.0f);
  xq.sxg.assign(M * xq.Gp, 0.0f);
  xq.sx.assign(M * xq.Gp, 0.0f);
  if (offset) xq.xoff.assign(M * xq.Gp * 16, 0);
  quantize_rows(x, M, K, [&](int64_t m, int64_t g, const int8_t* q, const GroupCodes& c) {
    const int64_t at = m * xq.Gp + g;
    std::memcpy(xq.q.data() + at * kGroup, q, kGroup);
    if (offset) offset_pairs(q, offset, xq.xoff.data() + at * 16);
    for (int i = 0; i < 8; ++i) xq.sx8[at * 8 + i] = c.d;
    for (int h = 0; h < 2; ++h) xq.sxs[at * 2 + h] = c.d * static_cast<float>(c.sums[h]);
    xq.sxg[at] = c.d * static_cast<float>(c.sums[0] + c.sums[1]);
    xq.sx[at] = c.d;
  });
  return xq;
}

// How each path feeds signed codes to an unsigned-by-signed byte product: avx512 with VNNI adds 128
// (code ^ 0x80, unsigned) and takes 128 * a * sx * sum(q) back through the b term; the others take
// |code| and move its sign onto the activation (vpsignb / a masked negate), b = 0.
enum class Signed { kSignOnX, kOffset };

// One weight row's per-group a (8 copies like sx8: lanes 0-3 the first half's, 4-7 the second's) and
// per-half b, padded like QuantX.
template <int64_t T, Signed form>
void weight_scales(const uint8_t* row, int64_t G, float* a8, float* b) {
  ScaleReader<T> scales(row);
  for (int64_t g = 0; g < G; ++g) {
    const Scales sc = scales.at(g);
    for (int i = 0; i < 8; ++i) a8[g * 8 + i] = sc.a[i / 4];
    for (int h = 0; h < 2; ++h)
      b[2 * g + h] = !signed_codes(T) ? sc.b[h] : form == Signed::kOffset ? -128.0f * sc.a[h] : 0.0f;
  }
  std::fill(a8 + G * 8, a8 + padded_groups(G) * 8, 0.0f);
  std::fill(b + 2 * G, b + 2 * padded_groups(G), 0.0f);
}

// sum_h b[h] * sxs[h] over padded half-groups (a multiple of 32: whole vectors).
inline float offset_term(const float* b, const float* sxs, int64_t halves) {
  Vec acc(0.0f);
  for (int64_t h = 0; h < halves; h += kLanes) acc = at::vec::fmadd(Vec::loadu(b + h), Vec::loadu(sxs + h), acc);
  return sum_lanes(acc);
}

// Whether the b term is needed: every unsigned type has an offset; signed codes only through the +128.
template <int64_t T, Signed form>
constexpr bool has_offset() { return !signed_codes(T) || form == Signed::kOffset; }

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

// Groups g and g+1 (g even; g+1 only where `pair`) as 64 bytes in code order: bytes 0-31 group g, 32-63
// group g+1, matching the activations' layout. Signed codes stay signed or take the +128 offset.
template <int64_t T, Signed form>
inline __m512i codes_pair(const uint8_t* row, int64_t g, bool pair) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  if constexpr (T == Q4_K) {
    // Groups 2k and 2k+1 of a super-block share 32 bytes: low nibbles, high nibbles.
    const __m256i v = load256(block_of<T>(row, g) + 16 + 16 * (g % 8));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, nib)),
                              _mm256_and_si256(_mm256_srli_epi16(v, 4), nib), 1);
  } else if constexpr (T == Q4_0 || T == Q4_1) {
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
  } else {
    const __m256i c1 = pair ? codes_group<T>(row, g + 1) : _mm256_setzero_si256();
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(codes_group<T>(row, g)), c1, 1);
    if constexpr (signed_codes(T) && form == Signed::kOffset)
      return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
    return w;
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
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
  }
}

template <int64_t T, int MT, int NT, bool VNNI>
inline void int_tile(const QuantX& xq, int64_t m0, const uint8_t* w, int64_t w_stride, const float* a8,
                     const float* bsc, const float* bias, float* out, int64_t out_stride) {
  constexpr Signed form = VNNI ? Signed::kOffset : Signed::kSignOnX;
  constexpr bool sign_x = signed_codes(T) && form == Signed::kSignOnX;
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
      prefetch_ahead(block_of<T>(w + j * w_stride, g));
      wc[j] = codes_pair<T, form>(w + j * w_stride, g, g + 1 < G);
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
      if constexpr (has_offset<T, form>())
        for (int64_t h = 0; h < 2 * Gp; h += 16)
          v = _mm512_fmadd_ps(_mm512_loadu_ps(bsc + j * 2 * Gp + h),
                              _mm512_loadu_ps(xq.sxs.data() + (m0 + i) * 2 * Gp + h), v);
      halves[i * NT + j] = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    }
  store_sums<MT, NT>(halves, bias, out, out_stride);
}

#elif defined(CPU_CAPABILITY_AVX2)

// The scales are read inline from each group's block (ScaleReader), not from a8/bsc: at one to a few
// rows, writing 8 copies of a and the b of every group first cost more than the dot products (the int8
// path ran no faster than the float one at 1 row, where llama.cpp's arithmetic is ~2x cheaper). The b
// term is a scalar sum per (row, output) in group order, so a row's result is the same in any tile.
template <int64_t T, int MT, int NT, bool VNNI>
inline void int_tile(const QuantX& xq, int64_t m0, const uint8_t* w, int64_t w_stride, const float* /*a8*/,
                     const float* /*bsc*/, const float* bias, float* out, int64_t out_stride) {
  static_assert(!half_scales(T), "the K-quants with a scale per 16 take the super-block tiles on avx2");
  const int64_t G = xq.G, Gp = xq.Gp;
  __m256 acc[MT][NT];
  float off[MT][NT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_setzero_ps(), off[i][j] = 0.0f;
  ScaleReader<T> scales0(w), scales1(w + (NT > 1 ? w_stride : 0));
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < G; ++g) {
    __m256i wc[NT], wabs[NT];
    Scales sc[NT];
    for (int j = 0; j < NT; ++j) {
      prefetch_ahead(block_of<T>(w + j * w_stride, g));
      sc[j] = (j == 0 ? scales0 : scales1).at(g);
      wc[j] = codes_group<T>(w + j * w_stride, g);
      wabs[j] = signed_codes(T) ? _mm256_abs_epi8(wc[j]) : wc[j];
    }
    for (int i = 0; i < MT; ++i) {
      const int64_t at = (m0 + i) * Gp + g;
      const __m256i x = load256(reinterpret_cast<const uint8_t*>(xq.q.data() + at * kGroup));
      const float sx = xq.sx8[at * 8];
      constexpr int c = code_offset(T);
      const __m256i xoff = c != 0 ? load256(reinterpret_cast<const uint8_t*>(xq.xoff.data() + at * 16)) : ones;
      for (int j = 0; j < NT; ++j) {
        const __m256i xj = signed_codes(T) ? _mm256_sign_epi8(x, wc[j]) : x;
        __m256i products = _mm256_maddubs_epi16(wabs[j], xj);
        if constexpr (c != 0) products = _mm256_sub_epi16(products, xoff);  // (code - c) * x, exactly
        const __m256i dot = _mm256_madd_epi16(products, ones);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sc[j].a[0] * sx), acc[i][j]);
        // std::fma: one rounding whatever the compiler makes of the tile's shape (contracted or
        // vectorised differently per MT, a row's sum would change with the rows beside it).
        // A b term only for a free minimum: a constant offset is folded in above, signed codes have none.
        if constexpr (c == 0 && !signed_codes(T))
          off[i][j] = std::fma(sc[j].b[0], xq.sxg[at], off[i][j]);  // one offset for the whole group
      }
    }
  }
  __m256 sums[(MT * NT + 7) / 8 * 8];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) sums[i * NT + j] = acc[i][j];
  store_sums<MT, NT>(sums, bias, out, out_stride);
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) out[i * out_stride + j] += off[i][j];
}

// ---- The K-quants with unsigned codes (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) on avx2: a super-block at a time.
// int_tile spent about twenty instructions per (group, output) on them: each group's scales read alone,
// its dot converted and scaled alone, Q6_K's 32 * x subtracted in int16, so Q4_K ran at a third of
// Q5_0's bytes a second and Q6_K at a quarter (1 row). Here each output's super-block scales are unpacked
// once (superblock_scales), three hadds fold four groups' int32 dots into one vector (lanes 0-3 their
// first halves, 4-7 their second), which one convert and one FMA scale, and the offsets (the mins, Q3_K's
// 4, Q6_K's 32) join the sum as one FMA per eight of superblock_scales' b with the activations' group or
// half sums. Every row's sum is the same in any tile (each (row, output) runs the same sequence).
constexpr bool superblock_tiles(int64_t t) { return t == Q2_K || t == Q3_K || t == Q4_K || t == Q5_K || t == Q6_K; }

// One output's super-block scales, as the tile reads them: quad[q] the a of groups 4q..4q+3 (lanes 0-3
// their first halves', 4-7 their second's: the folded dots' order), b[] superblock_scales' b in its own
// order (by group, or by 2 * group + half), which is the activations' sums' order too.
template <int64_t T>
struct SuperBlockScales {
  static constexpr int H = half_scales(T) ? 2 : 1;
  __m256 quad[2], b[H];
  explicit SuperBlockScales(const uint8_t* block) {
    if constexpr (T == Q4_K || T == Q5_K || T == Q6_K) {
      // The integer scales widened eight at a time: superblock_scales' scalar loops compiled to a byte
      // extract and a convert per scale, a third of Q4_K's time at one row.
      if constexpr (T == Q6_K) {
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192));
        const __m256 d = _mm256_set1_ps(half_at(block + 208));
        // Each quad's first halves (scales 2g) then its second halves (2g + 1).
        const __m128i by_half = _mm_shuffle_epi8(sc, _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
        quad[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(by_half)));
        quad[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(by_half, by_half))));
        const __m256 minus32d = _mm256_mul_ps(d, _mm256_set1_ps(-32.0f));
        b[0] = _mm256_mul_ps(minus32d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        b[1] = _mm256_mul_ps(minus32d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc))));
      } else {
        uint8_t sm[16];  // the eight scales, then the eight mins
        k_scales_mins(block + 4, sm);
        const __m128i both = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sm));
        const __m256 a = _mm256_mul_ps(_mm256_set1_ps(half_at(block)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(both)));
        quad[0] = _mm256_permute2f128_ps(a, a, 0x00);
        quad[1] = _mm256_permute2f128_ps(a, a, 0x11);
        b[0] = _mm256_mul_ps(_mm256_set1_ps(-half_at(block + 2)),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(both, both))));
      }
    } else {
      float a[8 * H], bs[8 * H];
      superblock_scales<T>(block, a, bs);
      alignas(32) float qa[16];
      for (int q = 0; q < 2; ++q)
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 4; ++k) qa[q * 8 + h * 4 + k] = a[(4 * q + k) * H + (H == 2 ? h : 0)];
      quad[0] = _mm256_load_ps(qa);
      quad[1] = _mm256_load_ps(qa + 8);
      for (int h = 0; h < H; ++h) b[h] = _mm256_loadu_ps(bs + 8 * h);
    }
  }
};

// The int32 dot of one group's codes and one row's int8 activations: lanes 0-3 its first 16 products.
inline __m256i group_dot(__m256i codes, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), _mm256_set1_epi16(1));
}

template <int64_t T, int MT, int NT>
inline void superblock_tile(const QuantX& xq, int64_t m0, const uint8_t* w, int64_t w_stride, const float* bias,
                            float* out, int64_t out_stride) {
  constexpr int H = SuperBlockScales<T>::H;
  const int64_t Gp = xq.Gp, blocks = xq.G / 8;
  __m256 acc[(MT * NT + 7) / 8 * 8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t s = 0; s < blocks; ++s) {
    const uint8_t* block[NT];
    for (int j = 0; j < NT; ++j) {
      block[j] = w + j * w_stride + s * block_bytes(T);
      // Every cache line of it (a super-block spans 2-4): one prefetch per block left Q6_K's rows waiting
      // on memory at their scales, its first bytes read.
      for (int64_t line = 0; line < block_bytes(T); line += 64) prefetch_ahead(block[j] + line);
    }
    for (int j = 0; j < NT; ++j) {
      const SuperBlockScales<T> sc(block[j]);
      for (int q = 0; q < 2; ++q) {
        __m256i pairs[MT][2];
        for (int p = 0; p < 2; ++p) {
          const int g = 4 * q + 2 * p;  // groups g and g + 1 of the super-block, decoded once for the rows
          const __m256i first = codes_group<T>(block[j], g), second = codes_group<T>(block[j], g + 1);
          for (int i = 0; i < MT; ++i) {
            const uint8_t* x = reinterpret_cast<const uint8_t*>(xq.q.data() + ((m0 + i) * Gp + 8 * s + g) * kGroup);
            pairs[i][p] = _mm256_hadd_epi32(group_dot(first, load256(x)), group_dot(second, load256(x + kGroup)));
          }
        }
        for (int i = 0; i < MT; ++i) {
          const __m256 sx = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(xq.sx.data() + (m0 + i) * Gp + 8 * s + 4 * q));
          acc[i * NT + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_hadd_epi32(pairs[i][0], pairs[i][1])),
                                            _mm256_mul_ps(sc.quad[q], sx), acc[i * NT + j]);
        }
      }
      for (int i = 0; i < MT; ++i) {  // the offsets: by the row's group sums, or its half sums
        const int64_t at = (m0 + i) * Gp + 8 * s;
        const float* sums = H == 1 ? xq.sxg.data() + at : xq.sxs.data() + 2 * at;
        for (int h = 0; h < H; ++h)
          acc[i * NT + j] = _mm256_fmadd_ps(sc.b[h], _mm256_loadu_ps(sums + 8 * h), acc[i * NT + j]);
      }
    }
  }
  store_sums<MT, NT>(acc, bias, out, out_stride);
}

template <int64_t T>
void superblock_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride, const float* bias,
                     float* out, int64_t N) {
  const QuantX xq = quantize_x(x, M, K);
  at::parallel_for(0, (N + 1) / 2, (grain(M, K) + 1) / 2, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = 2 * p;
      const float* b = bias ? bias + n : nullptr;
      auto rows = [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        row_tiles<4>(M, [&](auto mt, int64_t m) {
          constexpr int MT = decltype(mt)::value;
          if constexpr (MT == 1) {
            superblock_tile<T, 1, NT>(xq, m, w + n * w_stride, w_stride, b, out + m * N + n, N);
          } else {  // more rows: one output at a time, or a tile's accumulators and dots spill
            for (int j = 0; j < NT; ++j)
              superblock_tile<T, MT, 1>(xq, m, w + (n + j) * w_stride, w_stride, b ? b + j : nullptr,
                                        out + m * N + n + j, N);
          }
        });
      };
      if (n + 1 < N)
        rows(std::integral_constant<int, 2>{});
      else
        rows(std::integral_constant<int, 1>{});
    }
  });
}

// ---- Q4_0 and Q4_1 on avx2: two groups per register. One group's 16 bytes of nibbles filled half a
// register after a widening shuffle, and its scale cost a convert, a multiply and a broadcast of its
// own: about twenty instructions per (group, output) kept one core at ~9 GB/s of weights (AMD EPYC Zen
// 3), half what it reads. Here the 16 bytes of groups g and g+1 share one register, [g | g+1] as
// stored; its low nibbles are both groups' codes 0-15, its high nibbles their codes 16-31, and the
// activations are laid out to match (PairX). The two maddubs products of a pair add in int16 (at most
// 4 * 15 * 127), int32 lanes 0-3 are then group g's and 4-7 group g+1's, and both groups' scales come
// from one convert of four halves spread by one permute. Q4_0's codes sit at 8 (code_offset): 8 * x
// is subtracted in int16; Q4_1's minimum m adds m * sx * sum(q) per group, as a vector.
constexpr bool paired_groups(int64_t t) { return t == Q4_0 || t == Q4_1; }

// One row's activations for a pair of groups (g, g + 1), as the tiles read them: one record, so that a
// tile's rows at a pair are neighbours and one pointer walks a tile's pairs (PairX's order).
struct alignas(32) PairRow {
  int8_t q[64];  // g's codes 0-15, g+1's 0-15, g's 16-31, g+1's 16-31
  float sx[8];   // g's scale in lanes 0-3, g+1's in 4-7
  union {
    int16_t xoff[16];  // Q4_0: 8 * the four codes each int16 lane's products take
    float sxg[8];      // Q4_1: scale * the group's code sum in lanes 0 and 4, else 0
  };
};

// Every row's pairs, in tiles of 8 rows (fewer rows: one tile of them): [tiles][P][tile] (the last
// tile padded), so that the rows of a tile at a pair are neighbours and a tile's pairs one run of
// memory. (Pair-major over all the rows put a 1024-wide tile's 16 pairs 64 rows apart, 8 KB: the same
// L1 sets, more of them than its 8 ways.) An odd last group pairs with zeros.
struct PairX {
  static constexpr int64_t kTile = 8;
  std::vector<PairRow> rows;
  int64_t P, tile;
  int64_t index(int64_t m, int64_t p) const { return ((m / tile) * P + p) * tile + m % tile; }
  const PairRow* at(int64_t m, int64_t p) const { return rows.data() + index(m, p); }
};

PairX pair_layout(const float* x, int64_t M, int64_t K, int offset) {
  PairX px;
  px.P = (K / kGroup + 1) / 2;
  px.tile = std::clamp<int64_t>(M, 1, PairX::kTile);
  px.rows.assign((M + px.tile - 1) / px.tile * px.tile * px.P, PairRow{});
  quantize_rows(x, M, K, [&](int64_t m, int64_t g, const int8_t* q, const GroupCodes& c) {
    PairRow& row = px.rows[px.index(m, g / 2)];
    const int64_t h = g % 2;  // group g is the pair's first or its second
    std::memcpy(row.q + 16 * h, q, 16);
    std::memcpy(row.q + 32 + 16 * h, q + 16, 16);
    for (int64_t l = 0; l < 4; ++l) row.sx[4 * h + l] = c.d;
    if (offset) {
      // Lane i of the group's eight: the codes i's int16 lane multiplies, 2i and 2i + 1 of each half.
      int16_t pairs[16];
      offset_pairs(q, offset, pairs);
      for (int64_t i = 0; i < 8; ++i) row.xoff[8 * h + i] = static_cast<int16_t>(pairs[i] + pairs[8 + i]);
    } else {
      row.sxg[4 * h] = c.d * static_cast<float>(c.sums[0] + c.sums[1]);
    }
  });
  return px;
}

// One output's pair of groups (g, g + 1) read from its blocks: the codes as the activations are laid out
// (lo: both groups' codes 0-15, hi: their codes 16-31), the scales d spread to each group's four
// int32 lanes, and Q4_1's minimums alike (zero for Q4_0).
struct CodePair {
  __m256i lo, hi;
  __m256 d, mins;
};

template <int64_t T>
inline CodePair code_pair(const uint8_t* block, bool both) {
  constexpr int64_t B = block_bytes(T), codes_at = T == Q4_0 ? 2 : 4;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // Four halves converted: Q4_0 [d_g, d_g+1, 0, 0], Q4_1 [d_g, m_g, d_g+1, m_g+1]; spread to the lanes.
  const __m256i spread_d =
      T == Q4_0 ? _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1) : _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
  const __m256i spread_m = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + codes_at));
  const __m128i second =
      both ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + B + codes_at)) : _mm_setzero_si128();
  const __m256i raw = _mm256_set_m128i(second, first);
  uint32_t head0 = 0, head1 = 0;  // Q4_0: d (2 bytes), Q4_1: d and m (4)
  std::memcpy(&head0, block, T == Q4_0 ? 2 : 4);
  if (both) std::memcpy(&head1, block + B, T == Q4_0 ? 2 : 4);
  const __m128i halves = T == Q4_0 ? _mm_cvtsi32_si128(static_cast<int>(head0 | (head1 << 16)))
                                   : _mm_setr_epi32(static_cast<int>(head0), static_cast<int>(head1), 0, 0);
  const __m256 converted = _mm256_castps128_ps256(_mm_cvtph_ps(halves));
  return {_mm256_and_si256(raw, low4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
          _mm256_permutevar8x32_ps(converted, spread_d),
          T == Q4_1 ? _mm256_permutevar8x32_ps(converted, spread_m) : _mm256_setzero_ps()};
}

// acc += one output's pair of groups times one row's (the unit both tiles below repeat): the two
// products add in int16, Q4_0's 8 * x comes off there, then the int32 lane sums times d * sx.
template <int64_t T>
inline __m256 pair_dot(const CodePair& w, const PairRow& x, __m256 acc) {
  const uint8_t* q = reinterpret_cast<const uint8_t*>(x.q);
  __m256i products =
      _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, load256(q)), _mm256_maddubs_epi16(w.hi, load256(q + 32)));
  if constexpr (T == Q4_0) products = _mm256_sub_epi16(products, load256(reinterpret_cast<const uint8_t*>(x.xoff)));
  const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(products, _mm256_set1_epi16(1)));
  acc = _mm256_fmadd_ps(dot, _mm256_mul_ps(w.d, _mm256_load_ps(x.sx)), acc);
  if constexpr (T == Q4_1) acc = _mm256_fmadd_ps(w.mins, _mm256_load_ps(x.sxg), acc);
  return acc;
}

// MT rows x NT outputs from the blocks, each output's pairs decoded as the tile goes (the path for a
// few rows: every weight is read once a call, straight from memory).
template <int64_t T, int MT, int NT>
inline void pair_tile(const PairX& px, int64_t G, int64_t m0, const uint8_t* w, int64_t w_stride, const float* bias,
                      float* out, int64_t out_stride) {
  constexpr int64_t B = block_bytes(T);
  __m256 acc[(MT * NT + 7) / 8 * 8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const PairRow* x = px.at(m0, 0);
  for (int64_t p = 0; p < px.P; ++p, x += px.tile) {
    CodePair c[NT];
    for (int j = 0; j < NT; ++j) {
      const uint8_t* block = w + j * w_stride + 2 * p * B;
      prefetch_ahead(block);
      c[j] = code_pair<T>(block, 2 * p + 1 < G);
    }
    for (int i = 0; i < MT; ++i)
      for (int j = 0; j < NT; ++j) acc[i * NT + j] = pair_dot<T>(c[j], x[i], acc[i * NT + j]);
  }
  store_sums<MT, NT>(acc, bias, out, out_stride);
}

// MT rows x one output from its pairs decoded in a panel (the path for many rows: see pair_impl).
template <int64_t T, int MT>
inline void panel_tile(const PairX& px, int64_t m0, const CodePair* decoded, const float* bias, float* out,
                       int64_t out_stride) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const PairRow* x = px.at(m0, 0);
  for (int64_t p = 0; p < px.P; ++p, x += px.tile) {
    const CodePair c = decoded[p];
    for (int i = 0; i < MT; ++i) acc[i] = pair_dot<T>(c, x[i], acc[i]);
  }
  store_sums<MT, 1>(acc, bias, out, out_stride);
}

// Rows from which pair_impl decodes each output's pairs once into a panel and runs every row tile
// over it, rather than decoding them again in each tile of 4 rows. Decoding (two loads, an insert,
// three logic ops, the scales' convert and permutes) cost about as much as a tile's 8 products of it,
// and the 4 x 2 tile holding the decoded codes, scales and 8 accumulators at once ran out of AVX2's 16
// registers (its accumulators went through the stack). The panels' 8 x 1 tile is 8 instructions a
// product, none spilled. AMD EPYC Zen 3, Q4_0, mode 2, min us of 3 alternated runs (ops: one thread /
// two): 3072x1024 at 16 rows 1237 -> 1104 / 615 -> 547, 64 rows 4888 -> 3977 / 2473 -> 1960, 512 rows
// 53.7 -> 34.3 ms / 27.3 -> 16.5; 1024x512 at 64 rows 903 -> 688 / 493 -> 351. Below 16 rows the
// streaming tiles stay ahead where the weights come from memory (at 8 rows 549 against 627 us, 70 MB
// of weights, one thread): they overlap the reads with the products, the panels take them in turn.
constexpr int64_t kDecodedPairRows = 16;
// A panel's decoded pairs, at most: with an 8-row tile of activations (16 KB at 1024 wide) it stays in
// a 32 KB L1.
constexpr int64_t kPanelPairBytes = 8192;
// A block of rows' activations at the most (see pair_impl): well inside a 512 KB L2.
constexpr int64_t kRowBlockBytes = 131072;

template <int64_t T>
void pair_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride, const float* bias,
               float* out, int64_t N) {
  constexpr int64_t B = block_bytes(T);
  const PairX px = pair_layout(x, M, K, code_offset(T));
  const int64_t G = K / kGroup, P = px.P;
  if (M < kDecodedPairRows) {
    at::parallel_for(0, (N + 1) / 2, (grain(M, K) + 1) / 2, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t n = 2 * p;
        const float* b = bias ? bias + n : nullptr;
        auto rows = [&](auto nt) {
          row_tiles<4>(M, [&](auto mt, int64_t m) {
            pair_tile<T, decltype(mt)::value, decltype(nt)::value>(px, G, m, w + n * w_stride, w_stride, b,
                                                                   out + m * N + n, N);
          });
        };
        if (n + 1 < N)
          rows(std::integral_constant<int, 2>{});
        else
          rows(std::integral_constant<int, 1>{});
      }
    });
    return;
  }
  // Panels of outputs: each thread decodes a panel's pairs, then runs the rows over them in tiles of
  // up to 8 rows by one output: the 8 accumulators, the output's decoded pair and the products in
  // registers, each row's activations read once a tile where they are used. The rows go in blocks
  // whose activations stay in L2 while every panel of the thread passes over them (each panel decoded
  // again per block: a few instructions per pair against a block's 8 per row).
  const int64_t width = std::max<int64_t>(1, kPanelPairBytes / (P * static_cast<int64_t>(sizeof(CodePair))));
  const int64_t block_rows = std::max<int64_t>(
      1, kRowBlockBytes / (P * static_cast<int64_t>(sizeof(PairRow))) / PairX::kTile) * PairX::kTile;
  at::parallel_for(0, (N + width - 1) / width, 1, [&](int64_t begin, int64_t end) {
    std::vector<CodePair> panel(width * P);
    for (int64_t m_block = 0; m_block < M; m_block += block_rows)
      for (int64_t k = begin; k < end; ++k) {
        const int64_t n0 = k * width, n_panel = std::min(width, N - n0);
        for (int64_t j = 0; j < n_panel; ++j)
          for (int64_t p = 0; p < P; ++p)
            panel[j * P + p] = code_pair<T>(w + (n0 + j) * w_stride + 2 * p * B, 2 * p + 1 < G);
        for (int64_t m = m_block; m < std::min(M, m_block + block_rows); m += PairX::kTile)
          for (int64_t j = 0; j < n_panel; ++j) {
            const float* b = bias ? bias + n0 + j : nullptr;
            row_tiles<8>(std::min(PairX::kTile, M - m), [&](auto mt, int64_t i) {
              panel_tile<T, decltype(mt)::value>(px, m + i, panel.data() + j * P, b, out + (m + i) * N + n0 + j, N);
            });
          }
      }
  });
}

#else

template <int64_t T, int MT, int NT, bool VNNI>
inline void int_tile(const QuantX& xq, int64_t m0, const uint8_t* w, int64_t w_stride, const float* a8,
                     const float* bsc, const float* bias, float* out, int64_t out_stride) {
  const int64_t G = xq.G, Gp = xq.Gp;
  float acc[MT][NT] = {};
  int16_t codes[NT][kGroup];
  for (int64_t g = 0; g < G; ++g) {
    for (int j = 0; j < NT; ++j) {
      prefetch_ahead(block_of<T>(w + j * w_stride, g));
      codes_at<T>(w + j * w_stride, g, codes[j]);
    }
    for (int i = 0; i < MT; ++i) {
      const int8_t* x = xq.q.data() + ((m0 + i) * Gp + g) * kGroup;
      const float sx = xq.sx8[((m0 + i) * Gp + g) * 8];
      for (int j = 0; j < NT; ++j) {
        int32_t dot[2] = {0, 0};
        for (int64_t k = 0; k < kGroup; ++k) dot[k / 16] += static_cast<int32_t>(codes[j][k]) * x[k];
        const float* a = a8 + j * Gp * 8 + g * 8;
        acc[i][j] += sx * (a[0] * static_cast<float>(dot[0]) + a[4] * static_cast<float>(dot[1]));
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NT; ++j) {
      float s = acc[i][j] + (bias ? bias[j] : 0.0f);
      if constexpr (!signed_codes(T)) s += offset_term(bsc + j * 2 * Gp, xq.sxs.data() + (m0 + i) * 2 * Gp, 2 * Gp);
      out[i * out_stride + j] = s;
    }
}

#endif

// Whether int_tile reads each group's scales from its block (avx2) rather than from a8/bsc, filled per
// weight row first (avx512's 512-bit pairs of groups, the portable path).
#if defined(CPU_CAPABILITY_AVX2) && !defined(CPU_CAPABILITY_AVX512)
constexpr bool kScalesInline = true;
#else
constexpr bool kScalesInline = false;
#endif

// Which signed-code form each path's int_tile reads its b from (see Signed).
template <bool VNNI>
constexpr Signed signed_form() {
#if defined(CPU_CAPABILITY_AVX512)
  return VNNI ? Signed::kOffset : Signed::kSignOnX;
#else
  return Signed::kSignOnX;
#endif
}

template <int64_t T, int NT, bool VNNI>
inline void int_rows(const QuantX& xq, int64_t M, const uint8_t* w, int64_t w_stride, const float* a8,
                     const float* bsc, const float* bias, float* out, int64_t N) {
#if defined(CPU_CAPABILITY_AVX512)
  constexpr int widest = 8;  // 16 accumulators of the 32 registers: each decoded pair of groups serves 8 rows
#else
  constexpr int widest = 4;
#endif
  row_tiles<widest>(M, [&](auto mt, int64_t m) {
    int_tile<T, decltype(mt)::value, NT, VNNI>(xq, m, w, w_stride, a8, bsc, bias, out + m * N, N);
  });
}

// The one-group tiles (int_tile): every type on avx512 and portable, the rest on avx2.
template <int64_t T, bool VNNI>
void group_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride, const float* bias,
                float* out, int64_t N) {
  constexpr Signed form = signed_form<VNNI>();
  const QuantX xq = quantize_x(x, M, K, kScalesInline ? code_offset(T) : 0);
  const int64_t Gp = xq.Gp;
  const int64_t pairs = (N + 1) / 2;
  at::parallel_for(0, pairs, (grain(M, K) + 1) / 2, [&](int64_t begin, int64_t end) {
    std::vector<float> a8(kScalesInline ? 0 : 2 * Gp * 8), bsc(kScalesInline ? 0 : 2 * 2 * Gp);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = 2 * p;
      const int nt = n + 1 < N ? 2 : 1;
      if constexpr (!kScalesInline)
        for (int j = 0; j < nt; ++j)
          weight_scales<T, form>(w + (n + j) * w_stride, xq.G, a8.data() + j * Gp * 8, bsc.data() + j * 2 * Gp);
      const float* b = bias ? bias + n : nullptr;
      if (nt == 2)
        int_rows<T, 2, VNNI>(xq, M, w + n * w_stride, w_stride, a8.data(), bsc.data(), b, out + n, N);
      else
        int_rows<T, 1, VNNI>(xq, M, w + n * w_stride, w_stride, a8.data(), bsc.data(), b, out + n, N);
    }
  });
}

template <int64_t T, bool VNNI>
void int8_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride, const float* bias,
               float* out, int64_t N) {
#if defined(CPU_CAPABILITY_AVX2) && !defined(CPU_CAPABILITY_AVX512)
  if constexpr (paired_groups(T))
    pair_impl<T>(x, M, K, w, w_stride, bias, out, N);
  else if constexpr (superblock_tiles(T))
    superblock_impl<T>(x, M, K, w, w_stride, bias, out, N);
  else
    group_impl<T, VNNI>(x, M, K, w, w_stride, bias, out, N);
#else
  group_impl<T, VNNI>(x, M, K, w, w_stride, bias, out, N);
#endif
}

}  // namespace

void linear_int8(int64_t type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t w_stride,
                 const float* bias, float* out, int64_t N, bool vnni) {
  with_type(type, [&](auto t) {
    constexpr int64_t T = decltype(t)::value;
    if constexpr (!float_weights(T)) {
#if defined(CPU_CAPABILITY_AVX512)
      if (vnni) return int8_impl<T, true>(x, M, K, w, w_stride, bias, out, N);
#endif
      int8_impl<T, false>(x, M, K, w, w_stride, bias, out, N);
    }
  });
}

bool int8_pairs_groups(int64_t type) {
#if defined(CPU_CAPABILITY_AVX2) && !defined(CPU_CAPABILITY_AVX512)
  return paired_groups(type);
#else
  (void)type;
  return false;  // no pair tiles in this build
#endif
}

bool int8_superblock_tiles(int64_t type) {
#if defined(CPU_CAPABILITY_AVX2) && !defined(CPU_CAPABILITY_AVX512)
  return superblock_tiles(type);
#else
  (void)type;
  return false;  // no super-block tiles in this build
#endif
}

QUANT_END
