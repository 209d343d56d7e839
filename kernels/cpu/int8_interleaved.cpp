// The avx2 and avx512 paths' int8 tiles over the interleaved layouts (quant_interleaved.cpp): Q4_0, Q4_1,
// Q5_0, Q8_0, Q4_K, Q5_K and Q6_K with every 8 output rows interleaved. Both paths run the same 256-bit
// tiles; where the CPU has AVX512-VNNI (checked at run time, as quant_int8.cpp does) one vpdpbusd takes the
// place of each vpmaddubsw + vpmaddwd pair, with the same sums.
//
// Why: at one row the GGML layout's tiles (quant_int8.cpp's pair_tile, superblock_tile) decode each
// output's blocks alone: its scales converted and spread, its nibbles split, the activations loaded
// again per output, about 11 instructions per (output, group) for Q4_0. A one-row step then read its
// weights at 13-17 GB/s where two cores read 26-33 (AMD EPYC Zen 3): arithmetic, not memory, was the
// limit. Here one load of 16 bytes gives 8 outputs' scales in one convert, each maddubs multiplies 4
// outputs' codes by one broadcast run of 8 activations, and one hadd leaves one int32 per output: about
// 6 instructions per (output, group). A chunk's rows follow each other in memory, one stream per thread;
// the tiles still ask for each group's lines 1 KiB ahead (prefetch_ahead): a call over a layer's 0.2-1
// MB matrix is over before the hardware prefetcher alone ramps up (Zen 3, cold, one row, 2 threads,
// Q4_1: 576 x 1536 34-50 us without, 26-36 with; 3072 x 576 57-77 against 45-57).
//
// Every (row, output) sums its groups in one order whatever the row count or tile, so a row scores as
// it would alone (a speculative verify step's rows give what one-row decodes give).
//
// The avx512 path ran quant_int8.cpp's stored-layout tiles (8 rows x 2 outputs, two groups a 512-bit
// register) until these took their place there too: AMD EPYC Zen 4, 2 threads, TinyLlama's shapes x 2
// layers, Q4_0 / Q4_K / Q6_K, 1 row 3.65 / 5.51 / 7.94 -> 2.13 / 2.10 / 4.54 ms, 16 rows 17.4 / 20.4 /
// 31.9 -> 7.0 / 10.0 / 14.7 (docs/cpu-performance.md).
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "claimed_pieces.h"
#include "int8_rows.h"
#include "quant_linear.h"

QUANT_BEGIN

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)

namespace {

// The activations as the tiles read them, per (row, group): the group's 32 codes, its scale, and its
// offset term: Q4_0 and Q5_0 the codes' sum (int32, times code_offset taken off the integer dot), Q4_1
// scale * the codes' sum (float, times m); Q6_K 32 * each half's sum (its codes sit at 32, a scale per 16).
// Each maddubs takes one run of 8 codes broadcast to 32 bytes. `wide` stores the runs broadcast (128
// bytes a group, one plain load per maddubs: 5-10% faster at one row than broadcasting in the loop, and
// what the K-quant tiles, short of registers, read at any row count); otherwise the 32 codes are stored
// as they are and each run is broadcast as it is loaded. Several rows' codes are read again for every
// chunk of 8 outputs, and a quarter of the bytes stays nearer. AMD EPYC Zen 3, 2 threads, `quant_linear_ab
// --types ... --rows 4 16 64 --layers 2 --modes int8 --layouts interleaved`, the median over 4-5
// alternated rounds of each round's least of 7: Q4_0 64 rows 44.2 -> 38.7 ms, 16 rows 11.0 -> 10.4; Q4_1
// 64 rows 46.9 -> 42.6; Q8_0 64 rows 59.5 -> 58.1; 4 rows within the noise; Q4_K and Q6_K no faster
// (16 rows 2-6% slower), so they stay wide.
struct InterleavedX {
  std::vector<int8_t> q;  // [M][G][group_bytes()]
  std::vector<float> sx, offset;
  std::vector<int32_t> sum, halves32;  // sum: the group's codes'; halves32: [M][G][2]
  int64_t G;
  bool wide;
  int64_t group_bytes() const { return wide ? 128 : kGroup; }
};

// Run `run` (codes 8 * run .. 8 * run + 7) of one row's group, repeated to 32 bytes.
template <bool Wide>
inline __m256i x_run(const int8_t* x, int run) {
  if constexpr (Wide) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * run));
  } else {
    int64_t eight;
    std::memcpy(&eight, x + 8 * run, 8);
    return _mm256_set1_epi64x(eight);  // one vpbroadcastq from memory
  }
}

// The sum of R runs' products, unsigned codes by signed activations, 4 neighbouring bytes to an int32
// lane. Without VNNI the runs' pairs add in int16 first: only where R pairs of products cannot saturate
// (codes <= 15 for 4 runs, <= 63 for 2). With it, vpdpbusd by inline assembly: the avx512 build names no
// VNNI flag (it must load on every AVX-512 CPU), and Vnni is true only where the CPU has avx512_vnni.
template <bool Vnni, int R>
inline __m256i runs_dot(const __m256i* codes, const __m256i* xs) {
  if constexpr (Vnni) {
    __m256i acc = _mm256_setzero_si256();
    for (int r = 0; r < R; ++r) asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(codes[r]), "v"(xs[r]));
    return acc;
  } else {
    __m256i sum = _mm256_maddubs_epi16(codes[0], xs[0]);
    for (int r = 1; r < R; ++r) sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes[r], xs[r]));
    return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
  }
}

InterleavedX interleaved_x(const float* x, int64_t M, int64_t K, bool wide) {
  InterleavedX xq;
  xq.G = K / kGroup;
  xq.wide = wide;
  xq.q.resize(M * xq.G * xq.group_bytes());
  xq.sx.resize(M * xq.G);
  xq.offset.resize(M * xq.G);
  xq.sum.resize(M * xq.G);
  xq.halves32.resize(M * xq.G * 2);
  quantize_rows(x, M, K, [&](int64_t m, int64_t g, const int8_t* q, const GroupCodes& c) {
    const int64_t at = m * xq.G + g;
    int8_t* to = xq.q.data() + at * xq.group_bytes();
    if (xq.wide) {
      for (int run = 0; run < 4; ++run)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 32 * run), x_run<false>(q, run));
    } else {
      std::memcpy(to, q, kGroup);
    }
    const int sum = c.sums[0] + c.sums[1];
    xq.sx[at] = c.d;
    xq.offset[at] = c.d * static_cast<float>(sum);
    xq.sum[at] = sum;
    for (int h = 0; h < 2; ++h) xq.halves32[2 * at + h] = 32 * c.sums[h];
  });
  return xq;
}

// Block `index` of a chunk (its 8 rows' blocks, B bytes each), its lines asked for 1 KiB ahead.
template <int64_t T>
inline const uint8_t* chunk_block(const uint8_t* chunk, int64_t index) {
  constexpr int64_t bytes = kInterleavedRows * block_bytes(T);
  const uint8_t* block = chunk + index * bytes;
  for (int64_t line = 0; line < bytes; line += 64) prefetch_ahead(block + line);
  return block;
}

// 8 fp16 values (one per lane) as floats.
inline __m256 lane_halves(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A tile's sums, from kLaneRow's order back to the outputs' (64-bit pairs (0 1)(4 5)(2 3)(6 7) ->
// (0 1)(2 3)(4 5)(6 7)), the bias added.
template <int MT>
inline void store_chunk(const __m256* acc, const float* bias, float* out, int64_t out_stride) {
  for (int i = 0; i < MT; ++i) {
    __m256 sums = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(acc[i]), 0xD8));
    if (bias) sums = _mm256_add_ps(sums, _mm256_loadu_ps(bias));
    _mm256_storeu_ps(out + i * out_stride, sums);
  }
}

// One group of a chunk's 8 rows, decoded once for a tile's rows: 8 registers of 4 rows x 8 codes
// (codes[4q + k]: rows 4q..4q+3, the activations' run kRun[k]), unsigned; Q8_0's signs kept apart
// (maddubs multiplies unsigned by signed bytes: |code| by x with the code's sign).
template <int64_t T>
struct ChunkGroup {
  // Q4: run 2q's low nibbles meet activations 0-7, its high ones 16-23, run 2q + 1's 8-15 and 24-31.
  static constexpr int kRun[4] = {0, 2, 1, 3};
  __m256i codes[8], signs[T == Q8_0 ? 8 : 1];
  __m256 d;

  explicit ChunkGroup(const uint8_t* block) {
    d = lane_halves(block);
    if constexpr (T == Q8_0) {
      for (int r = 0; r < 8; ++r) {
        signs[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * r));
        codes[r] = _mm256_abs_epi8(signs[r]);
      }
    } else {
      constexpr int64_t codes_at = T == Q4_0 ? 16 : T == Q5_0 ? 48 : 32;
      const __m256i low4 = _mm256_set1_epi8(0x0F);
      for (int run = 0; run < 4; ++run) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + codes_at + 32 * run));
        codes[2 * run] = _mm256_and_si256(raw, low4);
        codes[2 * run + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
      if constexpr (T == Q5_0) add_fifth_bits(block + 16);
    }
  }

  // Q5_0: code j's fifth bit is bit j of its row's qh, so a run's low nibbles (codes 8h..8h+7 of its 4
  // rows) take byte h of each row's qh, its high ones byte 2 + h. One shuffle spreads those 4 bytes over
  // the run's 8-byte pieces (rows 4q, 4q + 1 | 4q + 2, 4q + 3, from half q's 16 bytes in both 128-bit
  // lanes); byte i of a piece keeps bit i.
  inline void add_fifth_bits(const uint8_t* qh) {
    const __m256i piece_row = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4,  //
                                               8, 8, 8, 8, 8, 8, 8, 8, 12, 12, 12, 12, 12, 12, 12, 12);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    const __m256i fifth = _mm256_set1_epi8(0x10);
    for (int q = 0; q < 2; ++q) {
      const __m256i half =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * q)));
      for (int h = 0; h < 2; ++h)
        for (int high = 0; high < 2; ++high) {
          const __m256i spread = _mm256_shuffle_epi8(half, _mm256_add_epi8(piece_row, _mm256_set1_epi8(h + 2 * high)));
          const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
          __m256i& c = codes[4 * q + 2 * h + high];
          c = _mm256_or_si256(c, _mm256_and_si256(set, fifth));
        }
    }
  }

  // Rows 4q..4q+3 by one activation row's group: two int32 lanes per row.
  template <bool Vnni, bool Wide>
  inline __m256i dot(int q, const int8_t* x) const {
    __m256i xs[4];
    if constexpr (T == Q8_0) {
      for (int r = 0; r < 4; ++r) xs[r] = _mm256_sign_epi8(x_run<Wide>(x, r), signs[4 * q + r]);
      if constexpr (Vnni) return runs_dot<true, 4>(codes + 4 * q, xs);
      // A maddubs of |code| <= 128 by |x| <= 127 pairs is at most 32512: each goes to int32 alone.
      __m256i sum = _mm256_setzero_si256();
      for (int r = 0; r < 4; ++r) sum = _mm256_add_epi32(sum, runs_dot<false, 1>(codes + 4 * q + r, xs + r));
      return sum;
    } else {
      for (int k = 0; k < 4; ++k) xs[k] = x_run<Wide>(x, kRun[k]);
      return runs_dot<Vnni, 4>(codes + 4 * q, xs);  // codes <= 31 (Q5_0): 4 * 2 * 31 * 127 < 32767
    }
  }
};

// MT rows x one chunk of 8 outputs: each group's 8 x 32 codes decoded once for the MT rows.
template <int64_t T, int MT, bool Vnni, bool Wide>
inline void chunk_tile(const InterleavedX& xq, int64_t m0, const uint8_t* chunk, const float* bias, float* out,
                       int64_t out_stride) {
  const int64_t G = xq.G;
  __m256 acc[MT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* block = chunk_block<T>(chunk, g);
    const ChunkGroup<T> group(block);
    for (int i = 0; i < MT; ++i) {
      const int64_t at = (m0 + i) * G + g;
      const int8_t* x = xq.q.data() + at * xq.group_bytes();
      // one int32 a row, kLaneRow's order
      __m256i dot =
          _mm256_hadd_epi32(group.template dot<Vnni, Wide>(0, x), group.template dot<Vnni, Wide>(1, x));
      if constexpr (code_offset(T) != 0)
        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(code_offset(T) * xq.sum[at]));  // the codes sit at c
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(group.d, _mm256_set1_ps(xq.sx[at])), acc[i]);
      if constexpr (T == Q4_1) {
        acc[i] = _mm256_fmadd_ps(lane_halves(block + 16), _mm256_set1_ps(xq.offset[at]), acc[i]);
      }
    }
  }
  store_chunk<MT>(acc, bias, out, out_stride);
}

// Q4_K: group s's 8 six-bit scales (kind 0) or mins (kind 1) from the packed 96 bytes, as floats in
// lane order (quant_interleaved.cpp's pack_k_scales: two 8-byte loads, a shift and a mask each).
inline __m256 k_values(const uint8_t* packed, int kind, int s) {
  uint64_t low, top;
  std::memcpy(&low, packed + 32 * kind + 8 * (s % 4), 8);
  std::memcpy(&top, packed + 64 + 16 * kind + 8 * (s % 2), 8);
  const uint64_t values =
      (low >> (4 * (s / 4)) & 0x0F0F0F0F0F0F0F0FULL) | (top >> (2 * (s / 2)) & 0x0303030303030303ULL) << 4;
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(values))));
}

// MT rows x one chunk of 8 outputs of Q4_K or Q5_K, a super-block at a time: each pair of groups' 8 x 64
// codes loaded once (low nibbles group 2p, high 2p + 1; Q5_K's fifth bits or'ed in as 16), each group's
// scales a * code + b per lane (a = d * scale, b = -dmin * min) made once for the MT rows.
template <int64_t T, int MT, bool Vnni>
inline void k_chunk_tile(const InterleavedX& xq, int64_t m0, const uint8_t* chunk, const float* bias, float* out,
                         int64_t out_stride) {
  static_assert(T == Q4_K || T == Q5_K, "Q4_K and Q5_K share the super-block tile");
  const int64_t G = xq.G;
  const __m256i low4 = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(0x10);
  __m256 acc[MT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < G / 8; ++sb) {
    const uint8_t* block = chunk_block<T>(chunk, sb);
    const __m256 d = lane_halves(block), minus_dmin = _mm256_sub_ps(_mm256_setzero_ps(), lane_halves(block + 16));
    for (int p = 0; p < 4; ++p) {
      __m256i raw[8];
      for (int r = 0; r < 8; ++r)
        raw[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 256 * p + 32 * r));
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * p + h;
        const __m256 a = _mm256_mul_ps(d, k_values(block + 32, 0, s));
        const __m256 b = _mm256_mul_ps(minus_dmin, k_values(block + 32, 1, s));
        __m256i codes[8];
        for (int r = 0; r < 8; ++r) {
          codes[r] = _mm256_and_si256(h ? _mm256_srli_epi16(raw[r], 4) : raw[r], low4);
          if constexpr (T == Q5_K) {  // bit s of the qh byte under each code, to bit 4 (16 + the nibble)
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 1152 + 32 * r));
            const __m256i bit = s <= 4 ? _mm256_slli_epi16(qh, 4 - s) : _mm256_srli_epi16(qh, s - 4);
            codes[r] = _mm256_or_si256(codes[r], _mm256_and_si256(bit, fifth));
          }
        }
        for (int i = 0; i < MT; ++i) {
          const int64_t at = (m0 + i) * G + 8 * sb + s;
          const int8_t* x = xq.q.data() + at * 128;  // wide
          const __m256i xs[4] = {x_run<true>(x, 0), x_run<true>(x, 1), x_run<true>(x, 2), x_run<true>(x, 3)};
          // codes <= 15 (Q5_K: 31): four runs' pairs add in int16 without saturating (4 * 2 * 31 * 127 < 32767)
          const __m256i quad[2] = {runs_dot<Vnni, 4>(codes, xs), runs_dot<Vnni, 4>(codes + 4, xs)};
          const __m256i dot = _mm256_hadd_epi32(quad[0], quad[1]);  // one int32 a row, kLaneRow's order
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(a, _mm256_set1_ps(xq.sx[at])), acc[i]);
          acc[i] = _mm256_fmadd_ps(b, _mm256_set1_ps(xq.offset[at]), acc[i]);
        }
      }
    }
  }
  store_chunk<MT>(acc, bias, out, out_stride);
}

// Q6_K: scale j's 8 int8 (one per lane) as floats.
inline __m256 q6_scales(const uint8_t* block, int j) {
  int64_t eight;
  std::memcpy(&eight, block + 16 + 8 * j, 8);
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight)));
}

// MT rows x one chunk of 8 outputs of Q6_K, a super-block at a time: for each group s = 4n + k its 6-bit
// codes are a nibble of the ql runs (low for k < 2, high for k >= 2) joined with bits 2k of the qh runs,
// made once for the MT rows. Codes <= 63: two maddubs add in int16 (2 * 2 * 63 * 127 < 32767), which is
// one half-group of 16, the unit of Q6_K's scales.
template <int MT, bool Vnni>
inline void q6_chunk_tile(const InterleavedX& xq, int64_t m0, const uint8_t* chunk, const float* bias, float* out,
                          int64_t out_stride) {
  const int64_t G = xq.G;
  const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
  __m256 acc[MT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < G / 8; ++sb) {
    const uint8_t* block = chunk_block<Q6_K>(chunk, sb);
    const __m256 d = lane_halves(block);
    for (int n = 0; n < 2; ++n) {
      __m256i qh[8];
      for (int r = 0; r < 8; ++r)
        qh[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 144 + 1024 + 256 * n + 32 * r));
      for (int h = 0; h < 2; ++h) {
        __m256i ql[8];
        for (int r = 0; r < 8; ++r)
          ql[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 144 + 256 * (2 * n + h) + 32 * r));
        for (int high = 0; high < 2; ++high) {
          const int k = h + 2 * high, s = 4 * n + k;
          __m256i codes[8];
          for (int r = 0; r < 8; ++r) {
            const __m256i nibble = _mm256_and_si256(high ? _mm256_srli_epi16(ql[r], 4) : ql[r], low4);
            // bits 2k..2k+1 to bits 4-5 (what crosses in from the neighbouring byte is masked off)
            const __m256i top = k < 2 ? _mm256_slli_epi16(qh[r], 4 - 2 * k) : _mm256_srli_epi16(qh[r], 2 * k - 4);
            codes[r] = _mm256_or_si256(nibble, _mm256_and_si256(top, top2));
          }
          const __m256 a[2] = {_mm256_mul_ps(d, q6_scales(block, 2 * s)), _mm256_mul_ps(d, q6_scales(block, 2 * s + 1))};
          for (int i = 0; i < MT; ++i) {
            const int64_t at = (m0 + i) * G + 8 * sb + s;
            const int8_t* x = xq.q.data() + at * 128;  // wide
            __m256i half[2][2];  // [half of the group][rows 0-3, 4-7]
            for (int q = 0; q < 2; ++q)
              for (int hf = 0; hf < 2; ++hf) {
                const __m256i xs[2] = {x_run<true>(x, 2 * hf), x_run<true>(x, 2 * hf + 1)};
                half[hf][q] = runs_dot<Vnni, 2>(codes + 4 * q + 2 * hf, xs);  // codes <= 63: 2 * 2 * 63 * 127 < 32767
              }
            const float sx = xq.sx[at];
            for (int hf = 0; hf < 2; ++hf) {
              const __m256i dot = _mm256_sub_epi32(_mm256_hadd_epi32(half[hf][0], half[hf][1]),
                                                   _mm256_set1_epi32(xq.halves32[2 * at + hf]));
              acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(a[hf], _mm256_set1_ps(sx)), acc[i]);
            }
          }
        }
      }
    }
  }
  store_chunk<MT>(acc, bias, out, out_stride);
}

// A block of rows' activations at the most, so that it stays in L2 while a thread's chunks pass over it.
constexpr int64_t kRowBlockBytes = 131072;

template <int64_t T, bool Vnni>
void interleaved_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* bias, float* out,
                      int64_t N) {
  constexpr bool k_quant = T == Q4_K || T == Q5_K || T == Q6_K;
  const InterleavedX xq = interleaved_x(x, M, K, k_quant || M == 1);
  const int64_t chunks = N / kInterleavedRows, chunk_bytes = kInterleavedRows * K / block_weights(T) * block_bytes(T);
  const int64_t block_rows = std::max<int64_t>(4, kRowBlockBytes / (xq.G * xq.group_bytes()) / 4 * 4);
  // Several rows: chunks claimed (claimed_pieces.h), so a thread that loses its core to another process
  // hands its chunks over; one row: halves, as claims cost there (a ~20 us linear of the bundled model's).
  // AMD EPYC Zen 4, 2 threads, min/median of 15-25 calls alternated in one process, halves / claims,
  // ms: quiet, equal within 3% at 1-64 rows; beside two processes that each spin 0.2-0.3 ms every 2 ms
  // (as the services do beside a worker), a 1B MoE's Q4_K attention and head linears at 8 rows 5.03 /
  // 4.26 (median), 64 rows 29.7 / 26.1, and at one row claims were slower (0.93 / 1.36).
  const auto split = [M](int64_t n, int64_t g, const auto& f) {
    if (M > 1)
      parallel_claimed(n, g, f);
    else
      at::parallel_for(0, n, g, f);
  };
  split(chunks, std::max<int64_t>(1, grain(M, K) / kInterleavedRows), [&](int64_t begin, int64_t end) {
    for (int64_t m_block = 0; m_block < M; m_block += block_rows)
      for (int64_t c = begin; c < end; ++c) {
        const float* b = bias ? bias + c * kInterleavedRows : nullptr;
        // A second tile over a chunk decodes its groups again and costs nearly a one-row tile, so the
        // last 5-7 rows go in one tile: a speculative verify step's rows of one request, a handful of
        // requests. The bundled model's linears (Q4_1 + a Q8_0 head, 2 threads, AMD EPYC Zen 3, the
        // least of 7 repeats over 3-5 alternated runs; the machine's noise was +-15%): 5 rows 7.1 -> 6.2
        // ms, 7 rows 9.2 -> 8.3-8.5; 8 rows and more tile as before (one tile of 8 was no faster).
        row_tiles_last<7>(std::min(block_rows, M - m_block), [&](auto mt, int64_t i) {
          const int64_t m = m_block + i;
          constexpr int MT = decltype(mt)::value;
          float* to = out + m * N + c * kInterleavedRows;
          if constexpr (T == Q4_K || T == Q5_K)
            k_chunk_tile<T, MT, Vnni>(xq, m, w + c * chunk_bytes, b, to, N);
          else if constexpr (T == Q6_K)
            q6_chunk_tile<MT, Vnni>(xq, m, w + c * chunk_bytes, b, to, N);
          else if (xq.wide)
            chunk_tile<T, MT, Vnni, true>(xq, m, w + c * chunk_bytes, b, to, N);
          else
            chunk_tile<T, MT, Vnni, false>(xq, m, w + c * chunk_bytes, b, to, N);
        });
      }
  });
}

}  // namespace

bool int8_interleaved() { return true; }

void linear_interleaved_int8(int64_t type, const float* x, int64_t M, int64_t K, const uint8_t* w, const float* bias,
                             float* out, int64_t N, bool vnni) {
  with_type(stored_type(type), [&](auto t) {
    constexpr int64_t T = decltype(t)::value;
    if constexpr (interleaved_layout(T) != 0) {
#if defined(CPU_CAPABILITY_AVX512)
      if (vnni) return interleaved_impl<T, true>(x, M, K, w, bias, out, N);
#endif
      interleaved_impl<T, false>(x, M, K, w, bias, out, N);
    }
  });
}

#else

bool int8_interleaved() { return false; }

void linear_interleaved_int8(int64_t, const float*, int64_t, int64_t, const uint8_t*, const float*, float*, int64_t,
                             bool) {
  TORCH_CHECK(false, "quant_linear: this build has no int8 tiles over interleaved rows");
}

#endif

QUANT_END
