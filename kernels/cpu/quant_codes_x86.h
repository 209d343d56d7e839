// Group g's 32 codes as 32 bytes in code order, in one 256-bit register: the vector form of
// quant_formats.h's codes_at, for the x86 paths (AVX2 instructions; the avx512 path uses them too, with
// an AVX512-BW mask move where it saves instructions). The float path widens these bytes to float
// lanes, the integer path multiplies them with int8 activations directly.
#pragma once

#include "quant_formats.h"

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)

QUANT_BEGIN

inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Each 16-bit lane shifted right by n: the bits that cross into a byte from its neighbour are masked
// off by every caller (only each byte's low bits are kept).
inline __m256i shift_right(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }

// The 2^bits - 1 low bits of each byte of v >> n.
inline __m256i field(__m256i v, int n, int bits) {
  return _mm256_and_si256(shift_right(v, n), _mm256_set1_epi8(static_cast<char>((1 << bits) - 1)));
}

// 16 bytes of nibbles -> 32 codes: the low nibbles (codes 0-15), then the high ones (16-31).
inline __m256i nibble_run(const uint8_t* p) {
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(c), _mm_srli_epi16(c, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits (Q5_0/Q5_1's fifth code bits) -> 32 bytes, byte i = 16 where bit i is set.
inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
#if defined(CPU_CAPABILITY_AVX512)
  return _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(16));
#else
  // Byte i takes byte i / 8 of the bits, then tests its own bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
#endif
}

// 4-bit indices -> the IQ4 codebook's int8 values (a byte shuffle per 128-bit lane).
inline __m256i iq4_values(__m256i indices) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kValuesIQ4)));
  return _mm256_shuffle_epi8(table, indices);
}

template <int64_t T>
inline __m256i codes_group(const uint8_t* row, int64_t g) {
  static_assert(!float_weights(T), "F16/BF16 have no codes");
  const uint8_t* block = block_of<T>(row, g);
  const int s = static_cast<int>(g % 8);
  if constexpr (T == Q8_0) {
    return load256(block + 2);
  } else if constexpr (T == Q4_0 || T == Q4_1) {
    return nibble_run(block + (T == Q4_0 ? 2 : 4));
  } else if constexpr (T == IQ4_NL) {
    return iq4_values(nibble_run(block + 2));
  } else if constexpr (T == IQ4_XS) {
    return iq4_values(nibble_run(block + 8 + 16 * s));
  } else if constexpr (T == Q5_0 || T == Q5_1) {
    constexpr int64_t off = T == Q5_0 ? 2 : 4;
    return _mm256_or_si256(nibble_run(block + off + 4), fifth_bits(block + off));
  } else if constexpr (T == Q2_K) {
    return field(load256(block + 16 + 32 * (s / 4)), 2 * (s % 4), 2);
  } else if constexpr (T == Q3_K) {
    const __m256i low = field(load256(block + 32 + 32 * (s / 4)), 2 * (s % 4), 2);
    return _mm256_or_si256(low, _mm256_slli_epi16(field(load256(block), s, 1), 2));
  } else if constexpr (T == Q4_K) {
    return field(load256(block + 16 + 32 * (s / 2)), 4 * (s % 2), 4);
  } else if constexpr (T == Q5_K) {
    const __m256i low = field(load256(block + 48 + 32 * (s / 2)), 4 * (s % 2), 4);
    return _mm256_or_si256(low, _mm256_slli_epi16(field(load256(block + 16), s, 1), 4));
  } else {  // Q6_K
    const __m256i low = field(load256(block + 64 * (s / 4) + 32 * (s % 2)), 4 * ((s % 4) / 2), 4);
    return _mm256_or_si256(low, _mm256_slli_epi16(field(load256(block + 128 + 32 * (s / 4)), 2 * (s % 4), 2), 4));
  }
}

QUANT_END

#endif
