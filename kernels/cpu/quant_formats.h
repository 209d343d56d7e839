// The GGML block formats the quantized-linear kernel reads, each as a run of 32-weight groups.
//
// Every integer format stores, per group of 32 weights, 32 small integer codes and one or two scale
// pairs: weight i = a[h] * code_i + b[h], h = i / 16 the half of the group (the types with 16-weight
// sub-blocks, Q2_K Q3_K Q6_K, have a pair per half; the others the same pair twice). The codes are
// unsigned bytes except where `signed_codes` (Q8_0 and the IQ4 types' codebook values, int8). So one
// decoder design serves them all: a type says where group g's codes and scales lie (this file, and
// quant_codes_x86.h for the vector form) and the drivers (quant_float.cpp, quant_int8.cpp) do the rest.
//
//   type    block  bytes  layout of a block                              code           a, b
//   Q4_0     32     18    d, 16 B nibbles (codes 0-15 low, 16-31 high)   0..15          d, -8d
//   Q4_1     32     20    d, m, 16 B nibbles                              0..15          d, m
//   Q5_0     32     22    d, 4 B high bits, 16 B nibbles                  0..31          d, -16d
//   Q5_1     32     24    d, m, 4 B high bits, 16 B nibbles               0..31          d, m
//   Q8_0     32     34    d, 32 int8                                      int8           d, 0
//   IQ4_NL   32     18    d, 16 B nibbles -> kValuesIQ4 (int8)            int8           d, 0
//   Q2_K    256     84    16 B (4-bit scale, 4-bit min per 16), 64 B of 2-bit codes, d, dmin
//                                                                         0..3    d sc, -dmin mn (per 16)
//   Q3_K    256    110    32 B high bits, 64 B 2-bit codes, 12 B of sixteen 6-bit scales, d
//                                                                         0..7    d (sc-32), -4a (per 16)
//   Q4_K    256    144    d, dmin, 12 B of eight 6-bit scales and mins, 128 B nibbles
//                                                                         0..15   d sc, -dmin mn
//   Q5_K    256    176    d, dmin, 12 B scales/mins, 32 B high bits, 128 B nibbles
//                                                                         0..31   d sc, -dmin mn
//   Q6_K    256    210    128 B low nibbles, 64 B 2-bit highs, 16 int8 scales, d
//                                                                         0..63   d sc, -32a (per 16)
//   IQ4_XS  256    136    d, 2 B + 4 B of eight 6-bit scales, 128 B nibbles -> kValuesIQ4
//                                                                         int8    d (ls-32), 0
// (d, m, dmin: fp16.) F16 and BF16 have no codes: a group is 32 stored values, converted to float.
// Every product a * code is exact in float32 (at most 24 significant bits: an 11-bit fp16 mantissa
// times a scale and a code of at most 13 significant bits together), so a decoded weight is a * code + b with one
// rounding, the same value the `gguf` package's dequantizer computes.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

// Every name of the quantized-linear kernel lives in quant::<its build's library>: the three ISA builds
// load side by side in one process (the tests load each), and a shared inline name would let one build's
// calls land in another's code.
#ifndef PAGEDSERVE_LIBRARY
#error "build with -DPAGEDSERVE_LIBRARY=<namespace> (kernels/cpu/build.py sets it)"
#endif
#define QUANT_BEGIN namespace quant { inline namespace PAGEDSERVE_LIBRARY {
#define QUANT_END } }

QUANT_BEGIN

enum Type : int64_t {
  F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12,
  Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
};

constexpr int64_t kGroup = 32;

constexpr bool supported(int64_t t) {
  switch (t) {
    case F16: case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: case Q2_K: case Q3_K: case Q4_K:
    case Q5_K: case Q6_K: case IQ4_NL: case IQ4_XS: case BF16:
      return true;
    default:
      return false;
  }
}

// Weights per block, and bytes per block.
constexpr int64_t block_weights(int64_t t) {
  switch (t) {
    case F16: case BF16: return 1;
    case Q2_K: case Q3_K: case Q4_K: case Q5_K: case Q6_K: case IQ4_XS: return 256;
    default: return 32;
  }
}
constexpr int64_t block_bytes(int64_t t) {
  switch (t) {
    case F16: case BF16: return 2;
    case Q4_0: case IQ4_NL: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q2_K: return 84;
    case Q3_K: return 110;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    case IQ4_XS: return 136;
    default: return 0;
  }
}

// Layouts of the kernel's own, not GGML's: a type's blocks with every 8 output rows interleaved
// (quant_interleaved.cpp). The same bytes per row as the stored type, so a tensor keeps its shape; the
// loader makes them (the `interleave_rows` op) where this build runs them natively.
constexpr int64_t kInterleavedBase = 100;
constexpr int64_t Q4_0_R8 = kInterleavedBase + Q4_0, Q4_1_R8 = kInterleavedBase + Q4_1,
                  Q5_0_R8 = kInterleavedBase + Q5_0, Q8_0_R8 = kInterleavedBase + Q8_0,
                  Q4_K_R8 = kInterleavedBase + Q4_K, Q5_K_R8 = kInterleavedBase + Q5_K,
                  Q6_K_R8 = kInterleavedBase + Q6_K;
constexpr int64_t kInterleavedRows = 8;
// The row of a chunk each of 8 lanes holds: the order one hadd of rows 0-3's and rows 4-7's int32 pairs
// leaves their 8 sums in (per 128-bit lane: rows 0 1 4 5 | 2 3 6 7). Per-row scales are stored in it.
constexpr int64_t kLaneRow[8] = {0, 1, 4, 5, 2, 3, 6, 7};
// The interleaved layout of a GGML type, or 0 where it has none (the one list of the types that have one).
constexpr int64_t interleaved_layout(int64_t t) {
  return t == Q4_0 || t == Q4_1 || t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q5_K || t == Q6_K
             ? t + kInterleavedBase
             : 0;
}
// Whether `t` is an interleaved layout: some GGML type's.
constexpr bool interleaved(int64_t t) { return t > kInterleavedBase && interleaved_layout(t - kInterleavedBase) == t; }
// The GGML type whose blocks an interleaved layout holds (a GGML type: itself).
constexpr int64_t stored_type(int64_t t) { return interleaved(t) ? t - kInterleavedBase : t; }

// The weight types whose every code sits at a constant offset c from zero (weight = a * (code - c)), c;
// else 0.
constexpr int code_offset(int64_t t) { return t == Q4_0 ? 8 : t == Q5_0 ? 16 : 0; }

// Stored float values, no codes: the integer (int8-activation) path does not apply.
constexpr bool float_weights(int64_t t) { return t == F16 || t == BF16; }
// int8 codes (the others are unsigned bytes).
constexpr bool signed_codes(int64_t t) { return t == Q8_0 || t == IQ4_NL || t == IQ4_XS; }
// A scale pair per 16 weights rather than per 32.
constexpr bool half_scales(int64_t t) { return t == Q2_K || t == Q3_K || t == Q6_K; }

// The IQ4 types' codebook: a 4-bit index -> an int8 value (llama.cpp's kvalues_iq4nl).
alignas(16) constexpr int8_t kValuesIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  return _cvtsh_ss(bits);  // F16C: one instruction, where c10's conversion is a dozen integer ops
#else
  return c10::detail::fp16_ieee_to_fp32_value(bits);
#endif
}

inline float bf16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

// The K-quants' eight 6-bit scales and mins (Q4_K, Q5_K), packed in 12 bytes: the first four of each in
// bytes 0-7's low six bits; the last four in bytes 8-11's nibbles, their top two bits in bytes 0-7's top two.
inline void k_scale_min(const uint8_t* packed, int64_t s, int* scale, int* min) {
  if (s < 4) {
    *scale = packed[s] & 63;
    *min = packed[s + 4] & 63;
  } else {
    *scale = (packed[s + 4] & 0xF) | ((packed[s - 4] >> 6) << 4);
    *min = (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4);
  }
}

// Q3_K's sixteen 6-bit scales in 12 bytes: the low nibbles in bytes 0-7 (scale i < 8 the low nibble of
// byte i, i >= 8 the high nibble of byte i - 8), the top two bits in bytes 8-11 (scale i: byte 8 + i % 4,
// bits 2 (i / 4) and up).
inline int q3k_scale(const uint8_t* packed, int64_t i) {
  const int low = i < 8 ? packed[i] & 0xF : packed[i - 8] >> 4;
  const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Group g's scale pairs: weight i = a[i / 16] * code_i + b[i / 16].
struct Scales {
  float a[2], b[2];
};

inline Scales both(float a, float b) { return {{a, a}, {b, b}}; }

template <int64_t T>
inline Scales scales_at(const uint8_t* row, int64_t g) {
  const int64_t s = g % 8;  // the group within a 256-weight super-block
  if constexpr (T == Q4_0 || T == Q5_0 || T == Q8_0 || T == IQ4_NL) {
    const float d = half_at(row + g * block_bytes(T));
    return both(d, T == Q4_0 ? -8.0f * d : T == Q5_0 ? -16.0f * d : 0.0f);
  } else if constexpr (T == Q4_1 || T == Q5_1) {
    const uint8_t* block = row + g * block_bytes(T);
    return both(half_at(block), half_at(block + 2));
  } else if constexpr (T == Q4_K || T == Q5_K) {
    const uint8_t* block = row + (g / 8) * block_bytes(T);
    int scale, min;
    k_scale_min(block + 4, s, &scale, &min);
    return both(half_at(block) * scale, -half_at(block + 2) * min);
  } else if constexpr (T == Q2_K) {
    const uint8_t* block = row + (g / 8) * 84;
    const float d = half_at(block + 80), dmin = half_at(block + 82);
    const uint8_t s0 = block[2 * s], s1 = block[2 * s + 1];
    return {{d * (s0 & 0xF), d * (s1 & 0xF)}, {-dmin * (s0 >> 4), -dmin * (s1 >> 4)}};
  } else if constexpr (T == Q3_K) {
    const uint8_t* block = row + (g / 8) * 110;
    const float d = half_at(block + 108);
    const float a0 = d * q3k_scale(block + 96, 2 * s), a1 = d * q3k_scale(block + 96, 2 * s + 1);
    return {{a0, a1}, {-4.0f * a0, -4.0f * a1}};
  } else if constexpr (T == Q6_K) {
    const uint8_t* block = row + (g / 8) * 210;
    const float d = half_at(block + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
    const float a0 = d * sc[2 * s], a1 = d * sc[2 * s + 1];
    return {{a0, a1}, {-32.0f * a0, -32.0f * a1}};
  } else if constexpr (T == IQ4_XS) {
    const uint8_t* block = row + (g / 8) * 136;
    uint16_t high;
    std::memcpy(&high, block + 2, 2);
    const int ls = ((block[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((high >> (2 * s)) & 3) << 4);
    return both(half_at(block) * (ls - 32), 0.0f);
  } else {
    return both(1.0f, 0.0f);  // F16, BF16: the values themselves
  }
}

// The packed 6-bit fields' masks: four bytes' worth at a time.
constexpr uint32_t kLow2 = 0x03030303, kLow4 = 0x0f0f0f0f, kLow6 = 0x3f3f3f3f;

// Q4_K's and Q5_K's 12 bytes of packed scales and mins -> sm[0..7] the eight scales, sm[8..15] the eight
// mins (k_scale_min, four at a time).
inline void k_scales_mins(const uint8_t* packed, uint8_t* sm) {
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_low = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_low;
  u[0] &= kLow6;
  std::memcpy(sm, u, 16);
}

// A super-block's eight groups' scales at once (the 256-weight types): a[k], b[k] for k = group (one
// pair a group) or 2 * group + half (half_scales types). The packed 6-bit fields are unpacked 32 bits at
// a time and the conversions are plain loops the compiler vectorizes: one group at a time cost more than
// the decoding of its codes (Q4_K at 1 row ran at half Q4_1's speed per byte).
template <int64_t T>
inline void superblock_scales(const uint8_t* block, float* a, float* b) {
  if constexpr (T == Q4_K || T == Q5_K) {
    uint8_t sm[16];
    k_scales_mins(block + 4, sm);
    const float d = half_at(block), dmin = half_at(block + 2);
    for (int k = 0; k < 8; ++k) a[k] = d * static_cast<float>(sm[k]);
    for (int k = 0; k < 8; ++k) b[k] = -dmin * static_cast<float>(sm[8 + k]);
  } else if constexpr (T == Q3_K) {
    uint32_t u[4];
    std::memcpy(u, block + 96, 12);
    // -> sixteen bytes, scale i = low nibble | top two bits << 4 (q3k_scale, four at a time)
    const uint32_t top = u[2];
    u[2] = ((u[0] >> 4) & kLow4) | (((top >> 4) & kLow2) << 4);
    u[3] = ((u[1] >> 4) & kLow4) | (((top >> 6) & kLow2) << 4);
    u[0] = (u[0] & kLow4) | ((top & kLow2) << 4);
    u[1] = (u[1] & kLow4) | (((top >> 2) & kLow2) << 4);
    uint8_t sc[16];
    std::memcpy(sc, u, 16);
    const float d = half_at(block + 108);
    for (int k = 0; k < 16; ++k) a[k] = d * static_cast<float>(static_cast<int>(sc[k]) - 32);
    for (int k = 0; k < 16; ++k) b[k] = -4.0f * a[k];
  } else if constexpr (T == Q2_K) {
    const float d = half_at(block + 80), dmin = half_at(block + 82);
    for (int k = 0; k < 16; ++k) a[k] = d * static_cast<float>(block[k] & 0xF);
    for (int k = 0; k < 16; ++k) b[k] = -dmin * static_cast<float>(block[k] >> 4);
  } else if constexpr (T == Q6_K) {
    const float d = half_at(block + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
    for (int k = 0; k < 16; ++k) a[k] = d * static_cast<float>(sc[k]);
    for (int k = 0; k < 16; ++k) b[k] = -32.0f * a[k];
  } else {  // IQ4_XS
    static_assert(T == IQ4_XS, "a type without super-blocks");
    uint16_t high;
    std::memcpy(&high, block + 2, 2);
    const float d = half_at(block);
    for (int k = 0; k < 8; ++k) {
      const int ls = ((block[4 + k / 2] >> (4 * (k % 2))) & 0xF) | (((high >> (2 * k)) & 3) << 4);
      a[k] = d * static_cast<float>(ls - 32);
      b[k] = 0.0f;
    }
  }
}

// One weight row's group scales, for groups read in order from 0 (or from any multiple of 8): a
// super-block's are unpacked together when its first group is read.
template <int64_t T>
struct ScaleReader {
  static constexpr int H = half_scales(T) ? 2 : 1;
  const uint8_t* row;
  float a[8 * H], b[8 * H];
  explicit ScaleReader(const uint8_t* r) : row(r) {}
  inline Scales at(int64_t g) {
    if constexpr (block_weights(T) == 256) {
      if (g % 8 == 0) superblock_scales<T>(row + (g / 8) * block_bytes(T), a, b);
      const int64_t k = (g % 8) * H;
      return {{a[k], a[k + H - 1]}, {b[k], b[k + H - 1]}};
    } else {
      return scales_at<T>(row, g);
    }
  }
};

// Where group g's bytes lie, for each format's parts (see the table above).
template <int64_t T>
inline const uint8_t* block_of(const uint8_t* row, int64_t g) {
  return row + (block_weights(T) == 256 ? g / 8 : g) * block_bytes(T);
}

// Group g's 32 codes in code order (signed types: their int8 values), plain C++: the portable path's
// decoder and the reading of the formats every vector form is held to.
template <int64_t T>
inline void codes_at(const uint8_t* row, int64_t g, int16_t* out) {
  const uint8_t* block = block_of<T>(row, g);
  const int64_t s = g % 8;
  for (int64_t i = 0; i < kGroup; ++i) {
    const int64_t j = i % 16, hi = i / 16;  // Q4_0-style nibble runs: byte j, low or high nibble
    int code = 0;
    if constexpr (T == Q8_0) {
      code = static_cast<int8_t>(block[2 + i]);
    } else if constexpr (T == Q4_0 || T == Q4_1 || T == IQ4_NL) {
      const uint8_t* qs = block + (T == Q4_1 ? 4 : 2);
      code = (qs[j] >> (4 * hi)) & 0xF;
      if constexpr (T == IQ4_NL) code = kValuesIQ4[code];
    } else if constexpr (T == Q5_0 || T == Q5_1) {
      const int64_t off = T == Q5_0 ? 2 : 4;
      uint32_t qh;
      std::memcpy(&qh, block + off, 4);
      code = ((block[off + 4 + j] >> (4 * hi)) & 0xF) | (((qh >> i) & 1) << 4);
    } else if constexpr (T == Q2_K) {
      code = (block[16 + 32 * (s / 4) + i] >> (2 * (s % 4))) & 3;
    } else if constexpr (T == Q3_K) {
      code = ((block[32 + 32 * (s / 4) + i] >> (2 * (s % 4))) & 3) | (((block[i] >> s) & 1) << 2);
    } else if constexpr (T == Q4_K) {
      code = (block[16 + 32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF;
    } else if constexpr (T == Q5_K) {
      code = ((block[48 + 32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF) | (((block[16 + i] >> s) & 1) << 4);
    } else if constexpr (T == Q6_K) {
      const int low = (block[64 * (s / 4) + 32 * (s % 2) + i] >> (4 * ((s % 4) / 2))) & 0xF;
      code = low | (((block[128 + 32 * (s / 4) + i] >> (2 * (s % 4))) & 3) << 4);
    } else if constexpr (T == IQ4_XS) {
      code = kValuesIQ4[(block[8 + 16 * s + j] >> (4 * hi)) & 0xF];
    }
    out[i] = static_cast<int16_t>(code);
  }
}

// Group g's 32 weights as floats (its scales `sc`), plain C++: the portable path's decoder. `codes`, if
// given, also receives the integer types' unscaled codes as floats (what the weights were made from).
template <int64_t T>
inline void weights_at(const uint8_t* row, int64_t g, const Scales& sc, float* out, float* codes_out = nullptr) {
  if constexpr (T == F16 || T == BF16) {
    for (int64_t i = 0; i < kGroup; ++i) {
      const uint8_t* p = row + (g * kGroup + i) * 2;
      out[i] = T == F16 ? c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(p[0] | (p[1] << 8)))
                        : bf16_at(p);
    }
  } else {
    int16_t codes[kGroup];
    codes_at<T>(row, g, codes);
    for (int64_t i = 0; i < kGroup; ++i) out[i] = sc.a[i / 16] * static_cast<float>(codes[i]) + sc.b[i / 16];
    if (codes_out != nullptr)
      for (int64_t i = 0; i < kGroup; ++i) codes_out[i] = static_cast<float>(codes[i]);
  }
}

// Calls f(std::integral_constant<int64_t, T>{}) for the runtime type `t` (a supported one).
template <class F>
inline void with_type(int64_t t, F&& f) {
  switch (t) {
    case F16: f(std::integral_constant<int64_t, F16>{}); break;
    case Q4_0: f(std::integral_constant<int64_t, Q4_0>{}); break;
    case Q4_1: f(std::integral_constant<int64_t, Q4_1>{}); break;
    case Q5_0: f(std::integral_constant<int64_t, Q5_0>{}); break;
    case Q5_1: f(std::integral_constant<int64_t, Q5_1>{}); break;
    case Q8_0: f(std::integral_constant<int64_t, Q8_0>{}); break;
    case Q2_K: f(std::integral_constant<int64_t, Q2_K>{}); break;
    case Q3_K: f(std::integral_constant<int64_t, Q3_K>{}); break;
    case Q4_K: f(std::integral_constant<int64_t, Q4_K>{}); break;
    case Q5_K: f(std::integral_constant<int64_t, Q5_K>{}); break;
    case Q6_K: f(std::integral_constant<int64_t, Q6_K>{}); break;
    case IQ4_NL: f(std::integral_constant<int64_t, IQ4_NL>{}); break;
    case IQ4_XS: f(std::integral_constant<int64_t, IQ4_XS>{}); break;
    case BF16: f(std::integral_constant<int64_t, BF16>{}); break;
    default: break;
  }
}

QUANT_END
