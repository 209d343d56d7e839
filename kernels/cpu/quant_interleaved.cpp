// Q4_0, Q4_1 and Q8_0 with every 8 output rows interleaved (quant_formats.h's Q4_0_R8, Q4_1_R8,
// Q8_0_R8), and the avx2 path's int8 tiles over them.
//
// Why: at one row the GGML layout's tiles (quant_int8.cpp's pair_tile) decode each output's blocks
// alone: its scales converted and spread, its nibbles split, the activations loaded again per output,
// about 11 instructions per (output, group). A one-row step then read its weights at 13-17 GB/s where
// two cores read 26-33 (AMD EPYC Zen 3): arithmetic, not memory, was the limit. Here one load of 16
// bytes gives 8 outputs' scales in one convert, each maddubs multiplies 4 outputs' codes by one
// broadcast run of 8 activations, and one hadd leaves one int32 per output: about 6 instructions per
// (output, group). A chunk's rows follow each other in memory, one stream per thread; the tiles still ask
// for each group's lines 1 KiB ahead (prefetch_ahead): a call over a layer's 0.2-1 MB matrix is over
// before the hardware prefetcher alone ramps up (AMD EPYC Zen 3, cold, one row, 2 threads, Q4_1: 576 x
// 1536 34-50 us without, 26-36 with; 3072 x 576 57-77 against 45-57).
//
// Layout. Chunk c (output rows 8c..8c+7) is 8 * row_bytes bytes; inside it, block g of the 8 rows is
// 8 * B bytes (B: the stored block's 18, 20 or 34):
//   - the 8 rows' scales d (fp16) in lane order kLaneRow (Q4_1: then their 8 minimums m, the same order);
//   - Q4_0 / Q4_1: 128 bytes of nibbles, 4 runs of 32, run 2q + h holding, for rows 4q..4q+3 in turn,
//     stored bytes 8h..8h+7 of that row's nibbles. Stored byte b holds code b (low nibble) and code
//     b + 16 (high), so a run's low nibbles are codes 8h..8h+7 of its 4 rows, its high ones 16+8h..23+8h;
//   - Q8_0: 256 bytes of codes, 8 runs of 32, run 4q + r holding codes 8r..8r+7 of rows 4q..4q+3.
// kLaneRow is the order in which one hadd of rows 0-3's and rows 4-7's int32 pairs leaves the 8 sums
// (per 128-bit lane: rows 0 1 4 5 | 2 3 6 7); the scales are stored in it, and one permute at the end
// puts the outputs back in order.
//
// Every (row, output) sums its groups in one order whatever the row count or tile, so a row scores as it
// would alone (a speculative verify step's rows give what one-row decodes give). Builds other than avx2
// (and the float32 modes everywhere) read these layouts through `deinterleave_rows`, back to the stored
// blocks: the same results as the stored type, bit for bit.
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "int8_rows.h"
#include "quant_linear.h"

QUANT_BEGIN
namespace {

constexpr int64_t kLaneRow[8] = {0, 1, 4, 5, 2, 3, 6, 7};

// Calls piece(offset in the chunk's block, row of the chunk, offset in that row's stored block, bytes)
// for every run of bytes of one interleaved block: the layout above, once, for both directions.
template <typename Piece>
void block_pieces(int64_t type, const Piece& piece) {
  const int64_t head = type == Q4_1 ? 4 : 2;  // d and m, or d, per row
  for (int64_t lane = 0; lane < 8; ++lane) {
    piece(2 * lane, kLaneRow[lane], 0, 2);
    if (type == Q4_1) piece(16 + 2 * lane, kLaneRow[lane], 2, 2);
  }
  const int64_t runs = type == Q8_0 ? 8 : 4, per_half = runs / 2;  // runs of rows 0-3, then of rows 4-7
  for (int64_t run = 0; run < runs; ++run)
    for (int64_t i = 0; i < 4; ++i)
      piece(8 * head + 32 * run + 8 * i, 4 * (run / per_half) + i, head + 8 * (run % per_half), 8);
}

}  // namespace

void interleave_rows(int64_t type, const uint8_t* w, int64_t N, int64_t row_bytes, uint8_t* out) {
  const int64_t B = block_bytes(type), blocks = row_bytes / B, chunk_bytes = kInterleavedRows * row_bytes;
  at::parallel_for(0, N / kInterleavedRows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t g = 0; g < blocks; ++g) {
        uint8_t* to = out + c * chunk_bytes + g * kInterleavedRows * B;
        const uint8_t* from = w + c * chunk_bytes + g * B;
        block_pieces(type, [&](int64_t at, int64_t row, int64_t in_row, int64_t n) {
          std::memcpy(to + at, from + row * row_bytes + in_row, n);
        });
      }
  });
}

void deinterleave_rows(int64_t type, const uint8_t* w, int64_t row_bytes, const int64_t* ids, int64_t count,
                       uint8_t* out) {
  const int64_t B = block_bytes(type), blocks = row_bytes / B, chunk_bytes = kInterleavedRows * row_bytes;
  at::parallel_for(0, count, std::max<int64_t>(1, 65536 / row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t chunk = ids[t] / kInterleavedRows, wanted = ids[t] % kInterleavedRows;
      for (int64_t g = 0; g < blocks; ++g) {
        const uint8_t* from = w + chunk * chunk_bytes + g * kInterleavedRows * B;
        uint8_t* to = out + t * row_bytes + g * B;
        block_pieces(type, [&](int64_t at, int64_t row, int64_t in_row, int64_t n) {
          if (row == wanted) std::memcpy(to + in_row, from + at, n);
        });
      }
    }
  });
}

#if defined(CPU_CAPABILITY_AVX2) && !defined(CPU_CAPABILITY_AVX512)

namespace {

// The activations as the tiles read them, per (row, group): the 32 codes as four runs of 8, each
// repeated 4 times (one 32-byte operand per maddubs, no broadcast in the loop: 5-10% faster at one row
// than broadcasting from the plain codes), the group's scale, and its offset term: Q4_0 8 * the codes'
// sum (int32, taken off the integer dot: the codes sit at 8), Q4_1 scale * the codes' sum (float, times m).
struct InterleavedX {
  std::vector<int8_t> q;  // [M][G][4][32]
  std::vector<float> sx, offset;
  std::vector<int32_t> sum8;
  int64_t G;
};

InterleavedX interleaved_x(const float* x, int64_t M, int64_t K) {
  InterleavedX xq;
  xq.G = K / kGroup;
  xq.q.resize(M * xq.G * 128);
  xq.sx.resize(M * xq.G);
  xq.offset.resize(M * xq.G);
  xq.sum8.resize(M * xq.G);
  quantize_rows(x, M, K, [&](int64_t m, int64_t g, const int8_t* q, const GroupCodes& c) {
    const int64_t at = m * xq.G + g;
    for (int64_t run = 0; run < 4; ++run) {
      int64_t eight;
      std::memcpy(&eight, q + 8 * run, 8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq.q.data() + at * 128 + 32 * run), _mm256_set1_epi64x(eight));
    }
    const int sum = c.sums[0] + c.sums[1];
    xq.sx[at] = c.d;
    xq.offset[at] = c.d * static_cast<float>(sum);
    xq.sum8[at] = 8 * sum;
  });
  return xq;
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
    d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    if constexpr (T == Q8_0) {
      for (int r = 0; r < 8; ++r) {
        signs[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * r));
        codes[r] = _mm256_abs_epi8(signs[r]);
      }
    } else {
      constexpr int64_t codes_at = T == Q4_0 ? 16 : 32;
      const __m256i low4 = _mm256_set1_epi8(0x0F);
      for (int run = 0; run < 4; ++run) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + codes_at + 32 * run));
        codes[2 * run] = _mm256_and_si256(raw, low4);
        codes[2 * run + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
    }
  }

  // Rows 4q..4q+3 by one activation row's group: two int32 lanes per row.
  inline __m256i dot(int q, const __m256i* x) const {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (T == Q8_0) {
      // A maddubs of |code| <= 128 by |x| <= 127 pairs is at most 32512: each goes to int32 alone.
      __m256i sum = _mm256_setzero_si256();
      for (int r = 0; r < 4; ++r) {
        const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256(x + r), signs[4 * q + r]);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(codes[4 * q + r], xs), ones));
      }
      return sum;
    } else {
      // Four maddubs of codes <= 15 add in int16 without saturating (4 * 2 * 15 * 127 < 32767).
      __m256i sum = _mm256_maddubs_epi16(codes[4 * q], _mm256_loadu_si256(x + kRun[0]));
      for (int k = 1; k < 4; ++k)
        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes[4 * q + k], _mm256_loadu_si256(x + kRun[k])));
      return _mm256_madd_epi16(sum, ones);
    }
  }
};

// MT rows x one chunk of 8 outputs: each group's 8 x 32 codes decoded once for the MT rows.
template <int64_t T, int MT>
inline void chunk_tile(const InterleavedX& xq, int64_t m0, const uint8_t* chunk, const float* bias, float* out,
                       int64_t out_stride) {
  constexpr int64_t B = block_bytes(T);
  const int64_t G = xq.G;
  __m256 acc[MT];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* block = chunk + g * kInterleavedRows * B;
    for (int64_t line = 0; line < kInterleavedRows * B; line += 64) prefetch_ahead(block + line);
    const ChunkGroup<T> group(block);
    for (int i = 0; i < MT; ++i) {
      const int64_t at = (m0 + i) * G + g;
      const auto* x = reinterpret_cast<const __m256i*>(xq.q.data() + at * 128);
      __m256i dot = _mm256_hadd_epi32(group.dot(0, x), group.dot(1, x));  // one int32 a row, kLaneRow's order
      if constexpr (T == Q4_0) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(xq.sum8[at]));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(group.d, _mm256_set1_ps(xq.sx[at])), acc[i]);
      if constexpr (T == Q4_1) {
        const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)));
        acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(xq.offset[at]), acc[i]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    // 64-bit pairs (0 1)(4 5)(2 3)(6 7) -> (0 1)(2 3)(4 5)(6 7)
    __m256 sums = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(acc[i]), 0xD8));
    if (bias) sums = _mm256_add_ps(sums, _mm256_loadu_ps(bias));
    _mm256_storeu_ps(out + i * out_stride, sums);
  }
}

// A block of rows' activations at the most, so that it stays in L2 while a thread's chunks pass over it.
constexpr int64_t kRowBlockBytes = 131072;

template <int64_t T>
void interleaved_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* bias, float* out,
                      int64_t N) {
  const InterleavedX xq = interleaved_x(x, M, K);
  const int64_t chunks = N / kInterleavedRows, chunk_bytes = kInterleavedRows * (K / kGroup) * block_bytes(T);
  const int64_t block_rows = std::max<int64_t>(4, kRowBlockBytes / (xq.G * 128) / 4 * 4);
  at::parallel_for(0, chunks, std::max<int64_t>(1, grain(M, K) / kInterleavedRows), [&](int64_t begin, int64_t end) {
    for (int64_t m_block = 0; m_block < M; m_block += block_rows)
      for (int64_t c = begin; c < end; ++c) {
        const float* b = bias ? bias + c * kInterleavedRows : nullptr;
        row_tiles<4>(std::min(block_rows, M - m_block), [&](auto mt, int64_t i) {
          const int64_t m = m_block + i;
          chunk_tile<T, decltype(mt)::value>(xq, m, w + c * chunk_bytes, b, out + m * N + c * kInterleavedRows, N);
        });
      }
  });
}

}  // namespace

bool int8_interleaved() { return true; }

void linear_interleaved_int8(int64_t type, const float* x, int64_t M, int64_t K, const uint8_t* w, const float* bias,
                             float* out, int64_t N) {
  if (type == Q4_0_R8)
    interleaved_impl<Q4_0>(x, M, K, w, bias, out, N);
  else if (type == Q4_1_R8)
    interleaved_impl<Q4_1>(x, M, K, w, bias, out, N);
  else
    interleaved_impl<Q8_0>(x, M, K, w, bias, out, N);
}

#else

bool int8_interleaved() { return false; }

void linear_interleaved_int8(int64_t, const float*, int64_t, int64_t, const uint8_t*, const float*, float*, int64_t) {
  TORCH_CHECK(false, "quant_linear: this build has no int8 tiles over interleaved rows");
}

#endif

QUANT_END
