// Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K with every 8 output rows interleaved (quant_formats.h's Q4_0_R8 ...):
// the byte layouts, made from the stored blocks and read back into them. The avx2 and avx512 paths' int8 tiles over
// them, and why they pay: int8_interleaved.cpp.
//
// Chunk c (output rows 8c..8c+7) is 8 * row_bytes bytes, the same as the 8 stored rows; inside it,
// block g of the 8 rows is 8 * B bytes (B: the stored block's 18, 20, 22, 34, 144, 176 or 210). kLaneRow
// (quant_formats.h) is the order the tiles' sums come out in; every per-row scale is stored in it.
//   - Q4_0 / Q4_1 / Q8_0: the 8 rows' scales d (fp16; Q4_1: then their 8 minimums m, the same order);
//   - Q4_0 / Q4_1: 128 bytes of nibbles, 4 runs of 32, run 2q + h holding, for rows 4q..4q+3 in turn,
//     stored bytes 8h..8h+7 of that row's nibbles. Stored byte b holds code b (low nibble) and code
//     b + 16 (high), so a run's low nibbles are codes 8h..8h+7 of its 4 rows, its high ones 16+8h..23+8h;
//   - Q5_0: as Q4_0, with the 8 rows' 4 bytes of fifth bits (qh) between the scales and the nibbles, in row
//     order (rows 0-3, then 4-7: one 16-byte load per half);
//   - Q8_0: 256 bytes of codes, 8 runs of 32, run 4q + r holding codes 8r..8r+7 of rows 4q..4q+3;
//   - Q4_K (a 256-weight super-block, 8 groups): d and dmin (16 bytes each, fp16); 96 bytes of the 8
//     rows' 6-bit group scales and mins, value 8s + lane for group s (PackedScales below); then per pair
//     of groups (2p, 2p + 1), which share stored bytes 32p..32p+31 (low nibbles group 2p, high 2p + 1),
//     256 bytes: 8 runs of 32, run 4q + r holding stored bytes 32p + 8r..+7 of rows 4q..4q+3;
//   - Q5_K: as Q4_K (its scales and nibbles are Q4_K's), then the fifth bits (qh, 32 bytes a row: bit s of
//     byte l is code l of group s) in 8 runs of 32 at 1152, run 4q + r holding qh bytes 8r..8r+7 of rows
//     4q..4q+3, so a run of them sits under the same codes as the nibbles' run r of every pair;
//   - Q6_K (256 weights, 16 scales): d (16 bytes); the 8 rows' int8 scales, scale j's 8 at 16 + 8j; then
//     each run of 8 stored bytes of the low nibbles (ql, 128 a row) and of the top two bits (qh, 64) in
//     runs of 32 as above: 4 runs of ql (stored bytes 64n + 32h.., low nibbles group 4n + h, high ones
//     4n + 2 + h), then 2 of qh (stored 32n.., bits 2k group 4n + k), 256 bytes each, run 4q + r of
//     one holding its bytes 8r..8r+7 of rows 4q..4q+3.
// Every path reads these layouts: the avx2 and avx512 int8 tiles directly, the rest through `deinterleave_rows`,
// back to the stored blocks (the same results as the stored type, bit for bit).
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "quant_linear.h"

QUANT_BEGIN
namespace {

// Calls piece(offset in the chunk's block, row of the chunk, offset in that row's stored block, bytes)
// for every run of bytes of one interleaved block (Q4_K, Q5_K: all but the packed scales): the layout above,
// once, for both directions.
template <typename Piece>
void block_pieces(int64_t type, const Piece& piece) {
  if (type == Q6_K) {
    for (int64_t lane = 0; lane < 8; ++lane) {
      piece(2 * lane, kLaneRow[lane], 208, 2);
      for (int64_t j = 0; j < 16; ++j) piece(16 + 8 * j + lane, kLaneRow[lane], 192 + j, 1);
    }
    // ql: runs (n, h) at 144 + 256 (2n + h) from stored 64n + 32h; qh: n at 1168 + 256n from 128 + 32n
    for (int64_t set = 0; set < 6; ++set) {
      const int64_t from = set < 4 ? 64 * (set / 2) + 32 * (set % 2) : 128 + 32 * (set - 4);
      for (int64_t run = 0; run < 8; ++run)
        for (int64_t i = 0; i < 4; ++i)
          piece(144 + 256 * set + 32 * run + 8 * i, 4 * (run / 4) + i, from + 8 * (run % 4), 8);
    }
    return;
  }
  const bool k_quant = type == Q4_K || type == Q5_K;
  const bool two_scales = type == Q4_1 || k_quant;  // d and m (Q4_K, Q5_K: d and dmin), or d
  for (int64_t lane = 0; lane < 8; ++lane) {
    piece(2 * lane, kLaneRow[lane], 0, 2);
    if (two_scales) piece(16 + 2 * lane, kLaneRow[lane], 2, 2);
  }
  if (k_quant) {
    const int64_t nibbles_from = type == Q5_K ? 48 : 16;  // Q5_K's 32 bytes of qh come first
    for (int64_t pair = 0; pair < 4; ++pair)
      for (int64_t run = 0; run < 8; ++run)
        for (int64_t i = 0; i < 4; ++i)
          piece(128 + 256 * pair + 32 * run + 8 * i, 4 * (run / 4) + i, nibbles_from + 32 * pair + 8 * (run % 4), 8);
    if (type == Q5_K)
      for (int64_t run = 0; run < 8; ++run)
        for (int64_t i = 0; i < 4; ++i) piece(1152 + 32 * run + 8 * i, 4 * (run / 4) + i, 16 + 8 * (run % 4), 8);
    return;
  }
  const int64_t head = two_scales ? 4 : 2;
  int64_t codes_at = 8 * head, codes_from = head;  // in the interleaved block, in a stored one
  if (type == Q5_0) {
    for (int64_t row = 0; row < 8; ++row) piece(16 + 4 * row, row, 2, 4);
    codes_at = 48, codes_from = 6;
  }
  const int64_t runs = type == Q8_0 ? 8 : 4, per_half = runs / 2;  // runs of rows 0-3, then of rows 4-7
  for (int64_t run = 0; run < runs; ++run)
    for (int64_t i = 0; i < 4; ++i)
      piece(codes_at + 32 * run + 8 * i, 4 * (run / per_half) + i, codes_from + 8 * (run % per_half), 8);
}

// Q4_K's 8 rows' scales and mins, 64 six-bit values each (value 8s + lane: group s of row
// kLaneRow[lane]), in 96 bytes: the low nibbles of the scales (byte j: values j and j + 32), of the
// mins, then the top two bits of the scales (byte j: values j, j + 16, j + 32, j + 48), of the mins. A
// group's 8 values are then two 8-byte loads, a shift and a mask each (int8_interleaved.cpp).
constexpr int64_t kPackedScalesAt = 32, kNibblesBytes = 32, kTopBitsBytes = 16;

void pack_k_scales(const uint8_t* const* rows, uint8_t* to) {
  uint8_t values[2][64];  // scales, mins
  for (int64_t lane = 0; lane < 8; ++lane) {
    uint8_t sm[16];  // the row's eight scales, then its eight mins
    k_scales_mins(rows[kLaneRow[lane]] + 4, sm);
    for (int64_t s = 0; s < 8; ++s) values[0][8 * s + lane] = sm[s], values[1][8 * s + lane] = sm[8 + s];
  }
  for (int64_t kind = 0; kind < 2; ++kind) {
    const uint8_t* v = values[kind];
    for (int64_t j = 0; j < 32; ++j)
      to[kNibblesBytes * kind + j] = static_cast<uint8_t>((v[j] & 15) | (v[j + 32] & 15) << 4);
    for (int64_t j = 0; j < 16; ++j)
      to[2 * kNibblesBytes + kTopBitsBytes * kind + j] =
          static_cast<uint8_t>(v[j] >> 4 | (v[j + 16] >> 4) << 2 | (v[j + 32] >> 4) << 4 | (v[j + 48] >> 4) << 6);
  }
}

// One row's (lane's) 12 stored bytes of scales and mins back from the packed 96, in GGML's packing
// (k_scale_min's inverse).
void unpack_k_scales(const uint8_t* from, int64_t lane, uint8_t* stored) {
  uint8_t v[2][8];
  for (int64_t kind = 0; kind < 2; ++kind)
    for (int64_t s = 0; s < 8; ++s) {
      const int64_t at = 8 * s + lane;
      const int low = from[kNibblesBytes * kind + at % 32] >> (4 * (at / 32)) & 15;
      const int top = from[2 * kNibblesBytes + kTopBitsBytes * kind + at % 16] >> (2 * (at / 16)) & 3;
      v[kind][s] = static_cast<uint8_t>(low | top << 4);
    }
  for (int64_t j = 0; j < 4; ++j) {
    stored[j] = static_cast<uint8_t>((v[0][j] & 63) | (v[0][j + 4] >> 4) << 6);
    stored[j + 4] = static_cast<uint8_t>((v[1][j] & 63) | (v[1][j + 4] >> 4) << 6);
    stored[j + 8] = static_cast<uint8_t>((v[0][j + 4] & 15) | (v[1][j + 4] & 15) << 4);
  }
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
        if (type == Q4_K || type == Q5_K) {  // the same 12 bytes of scales and mins, at 4
          const uint8_t* rows[8];
          for (int64_t r = 0; r < 8; ++r) rows[r] = from + r * row_bytes;
          pack_k_scales(rows, to + kPackedScalesAt);
        }
      }
  });
}

void deinterleave_rows(int64_t type, const uint8_t* w, int64_t row_bytes, const int64_t* ids, int64_t count,
                       uint8_t* out) {
  const int64_t B = block_bytes(type), blocks = row_bytes / B, chunk_bytes = kInterleavedRows * row_bytes;
  at::parallel_for(0, count, std::max<int64_t>(1, 65536 / row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t chunk = ids[t] / kInterleavedRows, wanted = ids[t] % kInterleavedRows;
      int64_t lane = 0;  // the lane holding the wanted row's per-row values
      while (kLaneRow[lane] != wanted) ++lane;
      for (int64_t g = 0; g < blocks; ++g) {
        const uint8_t* from = w + chunk * chunk_bytes + g * kInterleavedRows * B;
        uint8_t* to = out + t * row_bytes + g * B;
        block_pieces(type, [&](int64_t at, int64_t row, int64_t in_row, int64_t n) {
          if (row == wanted) std::memcpy(to + in_row, from + at, n);
        });
        if (type == Q4_K || type == Q5_K) unpack_k_scales(from + kPackedScalesAt, lane, to + 4);
      }
    }
  });
}

QUANT_END
