// One token per row of logits for the CPU sampler (services/worker/sampler.py): two or three
// passes over each row, in place, instead of the torch path's dozen tensor ops and full-size
// temporaries.
//
// pagedserve_sampling_<isa>::sample_rows(logits [R, V] float32 | bfloat16, inv_temperature [R] float32
//   (0 = greedy), uniforms [R] float32, top_k [R] int64 (0 = off), top_p [R] float32 (1 = off),
//   min_p [R] float32 (0 = off)) -> tokens [R] int64
//
// The semantics are the torch path's (services/worker/truncation.py), per row:
// - greedy: the first index of the maximum (as torch.argmax: the first NaN if there is one);
// - otherwise in y = (x - max) / T * log2(e), the scaled logit less the row's best in bits (<= 0,
//   the weight is 2^y): top-k keeps the k best; top-p the fewest best whose mass, renormalised over
//   the top-k set when there is one, reaches p; min-p keeps y >= log2(min_p). Each rule is a floor
//   on y, the highest wins, and tokens tied with the floor stay;
// - the draw is the inverse CDF over the kept weights in vocabulary order with the row's uniform:
//   the first token whose running sum exceeds u * total.
// An untruncated row is drawn in one pass that sums 256-token blocks; only the block the target
// falls in is walked token by token. A truncated row first collects candidates (value and token
// id, in vocabulary order, by a vectorised compress): for min-p alone the tokens above its floor;
// for top-k / top-p the tokens within 12 bits of the best, then 24, 48, and only then all of
// them, until they hold the k best or the nucleus closes inside them. The nucleus is found by a
// weighted quickselect (expected linear), not a sort, and the draw walks only the candidates.
// A sampling row whose maximum is not finite (NaN, +inf, or every token masked) takes the argmax.
//
// One source, three ISA paths (kernels/cpu/isa.py builds each with its own flags and CPU_CAPABILITY
// macro; the sampler runs the best one the CPU has). The vector code is written over ATen's
// at::vec::Vectorized<float>, so the macro picks its width and instructions:
// - avx512: 16 lanes; comparisons to masks by movepi32, candidates by the compress-store instructions;
// - avx2: 8 lanes; masks by movemask, candidates by a permutation from a 256-entry table (AVX2 has no
//   compress). Against a scalar compaction on this path (fastest of 21 calls) the table measured the
//   same with few candidates (logits N(0, 3^2)) and 3-43% faster where most of the row is a candidate
//   (N(0, 0.3^2): top-p 1.72 vs 1.76 ms at B = 1, min-p 0.31 vs 0.39, top-k 5.2 vs 9.2 at B = 8);
// - portable: ATen's generic Vectorized (plain arrays the compiler vectorises for its baseline, SSE2
//   or NEON), comparisons and compaction lane by lane, no intrinsics.
// exp2 is this file's own polynomial on every path, so the paths differ only in rounding (fused or
// separate multiply-adds). Only the avx2 and portable paths have been run (tests/unit/sampler); the
// avx512 path is compile-checked.
//
// Measured with ops/microbench/sampler.py (--threads 1 --repeats 15, one Sampler.sample call, vocab
// 49152, logits N(0, 3^2), temperature 0.6), on an AMD EPYC (Zen 3, 2 cores shared with other builds,
// AVX2/FMA/F16C, no AVX-512), fastest call in ms, float32 / bfloat16, B = 64:
//                 torch path     avx2        portable     before (scalar lanes, built -mavx2)
//   greedy        15.8 / 27.5    2.2 / 1.7    9.2 / 11.2    8.3 / 15.2
//   temperature   26.3 / 76.5    2.7 / 3.5   22.3 / 24.4   24.9 / 33.6
//   top-k 50      82.9 / 114     7.5 / 3.2   17.0 / 11.8   15.5 / 16.5
//   top-p 0.9      153 / 141     8.5 / 3.6   24.3 / 20.4   33.3 / 33.0
//   min-p 0.05    55.5 / 114     2.2 / 2.5    9.6 / 10.4    9.0 / 15.0
// and B = 1 (float32): torch 0.13-2.9, avx2 0.09-0.33, portable 0.17-0.41, before 0.13-0.53. The
// machine was loaded (load average ~4.6): repeat runs moved single cells by up to 2.3x, never avx2
// from first place.

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include "library.h"
#include <torch/types.h>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using Int = at::vec::Vectorized<int32_t>;
using BFloat16 = c10::BFloat16;
using Mask = uint32_t;  // one bit per lane

constexpr int64_t kLanes = Vec::size();  // 16 (avx512) or 8 (avx2, portable)
constexpr Mask kAll = Mask((uint64_t(1) << kLanes) - 1);
constexpr int64_t kBlock = 256;  // tokens per partial sum of an untruncated draw (a multiple of 4 * kLanes)
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kDepths[] = {-12.0f, -24.0f, -48.0f, -kInf};  // top-k / top-p candidates: y >= depth
static_assert(kBlock % (4 * kLanes) == 0, "a block is whole steps of four vectors");

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// One bit per lane of a comparison's result (all ones where true, zero where false).
inline Mask bits(Vec m) {
#if defined(CPU_CAPABILITY_AVX512)
  return Mask(_mm512_movepi32_mask(_mm512_castps_si512(m)));
#else
  return Mask(_mm256_movemask_ps(m));
#endif
}
#endif

// kLanes logits as float, all in the row.
inline Vec load(const float* p) { return Vec::loadu(p); }
inline Vec load(const BFloat16* p) {
  Vec v;
  at::vec::load_fp32_from_bf16(p, v);
  return v;
}
// The last `count` (< kLanes) logits of a row; the lanes past its end hold -inf.
template <typename T>
inline Vec load_tail(const T* p, int64_t count) {
  float lanes[kLanes];
  for (int64_t i = 0; i < kLanes; ++i) lanes[i] = i < count ? float(p[i]) : -kInf;
  return Vec::loadu(lanes);
}

inline Vec bits_below_max(Vec x, float max, float scale) { return (x - Vec(max)) * Vec(scale); }

// 2^y for y <= 0 (and -inf): 2^n * 2^f with |f| <= 1/2, e^(f ln2) to degree 6 (~1 ulp). 2^n is
// built in the exponent field as 2^(n+64) (a normal float for every n in [-160, 0]) and scaled by
// 2^-64, so results below 2^-126 round to the denormal they are. Clamped at -160, where it is
// exactly 0: a masked (-inf) token must weigh nothing.
inline Vec exp2_nonpositive(Vec y) {
  y = at::vec::clamp_min(y, Vec(-160.0f));
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  const Vec n = y.round();
#else  // round() is a libm call per lane without SSE4.1: adding and taking 1.5 * 2^23 rounds to nearest
  const Vec n = (y + Vec(12582912.0f)) - Vec(12582912.0f);
#endif
  const Vec f = y - n;
  Vec p = Vec(1.5403530393381606e-4f);  // ln2^6 / 6!
  p = at::vec::fmadd(p, f, Vec(1.3333558146428443e-3f));
  p = at::vec::fmadd(p, f, Vec(9.6181291076284772e-3f));
  p = at::vec::fmadd(p, f, Vec(5.5504108664821580e-2f));
  p = at::vec::fmadd(p, f, Vec(2.4022650695910071e-1f));
  p = at::vec::fmadd(p, f, Vec(6.9314718055994531e-1f));
  p = at::vec::fmadd(p, f, Vec(1.0f));
  const Int exponent = (at::vec::convert_to_int_of_same_size(n) + Int(127 + 64)) << Int(23);
  return p * at::vec::cast<float>(exponent) * Vec(0x1p-64f);
}

inline float reduce_max(Vec v) {
  return at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, v);
}
inline float reduce_add(Vec v) {
  return at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return a + b; }, v);
}
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
inline Mask is_nan(Vec v) { return bits(v.isnan()); }
inline Mask is_equal(Vec v, float x) { return bits(v == Vec(x)); }
inline Mask at_least(Vec v, float x) { return bits(v >= Vec(x)); }
// w where y >= floor, else 0.
inline Vec where_at_least(Vec y, float floor, Vec w) { return w & (y >= Vec(floor)); }
#else
// portable: ATen's generic comparisons build each lane's all-ones or zero with a memset, which the
// compiler keeps lane by lane; a plain loop over the lanes' values is several times faster.
template <typename P>
inline Mask lanes_where(Vec v, P pred) {
  float lanes[kLanes];
  v.store(lanes);
  Mask m = 0;
  for (int i = 0; i < kLanes; ++i) m |= Mask(pred(lanes[i])) << i;
  return m;
}
inline Mask is_nan(Vec v) { return lanes_where(v, [](float x) { return std::isnan(x); }); }
inline Mask is_equal(Vec v, float y) { return lanes_where(v, [=](float x) { return x == y; }); }
inline Mask at_least(Vec v, float y) { return lanes_where(v, [=](float x) { return x >= y; }); }
inline Vec where_at_least(Vec y, float floor, Vec w) {
  float ys[kLanes], ws[kLanes];
  y.store(ys), w.store(ws);
  for (int i = 0; i < kLanes; ++i) ws[i] = ys[i] >= floor ? ws[i] : 0.0f;
  return Vec::loadu(ws);
}
#endif
inline int first_lane(Mask m) { return __builtin_ctz(m); }
inline int count(Mask m) { return __builtin_popcount(m); }

// Appends the lanes of `v` picked by `m`, and their token ids (`first` + lane), in lane order.
// May write all kLanes lanes of `values` and `ids`: both have kLanes of room past the row's length.
#if defined(CPU_CAPABILITY_AVX512)
inline int compress(float* values, int32_t* ids, Mask m, Vec v, int32_t first) {
  _mm512_mask_compressstoreu_ps(values, __mmask16(m), v);
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  _mm512_mask_compressstoreu_epi32(ids, __mmask16(m), _mm512_add_epi32(_mm512_set1_epi32(first), lanes));
  return count(m);
}
#elif defined(CPU_CAPABILITY_AVX2)
// AVX2 has no compress: each 8-bit mask indexes the permutation that moves its lanes to the front,
// eight 4-bit lane numbers packed in one word (1 KiB in all).
struct CompressTable {
  uint32_t lanes[256];
  constexpr CompressTable() : lanes() {
    for (int m = 0; m < 256; ++m) {
      uint32_t packed = 0;
      int at = 0;
      for (int i = 0; i < 8; ++i)
        if (m >> i & 1) packed |= uint32_t(i) << (4 * at++);
      lanes[m] = packed;
    }
  }
};
constexpr CompressTable kCompress;
inline int compress(float* values, int32_t* ids, Mask m, Vec v, int32_t first) {
  const __m256i order = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(int(kCompress.lanes[m])), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(7));
  _mm256_storeu_ps(values, _mm256_permutevar8x32_ps(v, order));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(ids), _mm256_add_epi32(_mm256_set1_epi32(first), order));
  return count(m);
}
#else
inline int compress(float* values, int32_t* ids, Mask m, Vec v, int32_t first) {
  float lanes[kLanes];
  v.store(lanes);
  int n = 0;
  for (int i = 0; i < kLanes; ++i)
    if (m >> i & 1) values[n] = lanes[i], ids[n++] = first + i;
  return n;
}
#endif

// The row's maximum, or NaN with `first_nan` set. Four accumulators: max's latency, not its
// throughput, would otherwise bound the pass. clamp_min is the bare max instruction (a NaN lane keeps
// the running best): NaN is looked for apart, and maximum's NaN propagation would cost two more.
template <typename T>
float row_max(const T* x, int64_t n, int64_t& first_nan) {
  Vec best[4] = {Vec(-kInf), Vec(-kInf), Vec(-kInf), Vec(-kInf)};
  Mask nan = 0;
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int j = 0; j < 4; ++j) {
      const Vec v = load(x + i + j * kLanes);
      nan |= is_nan(v);
      best[j] = at::vec::clamp_min(best[j], v);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    const Vec v = load(x + i);
    nan |= is_nan(v);
    best[0] = at::vec::clamp_min(best[0], v);
  }
  if (i < n) {
    const Vec v = load_tail(x + i, n - i);
    nan |= is_nan(v);
    best[0] = at::vec::clamp_min(best[0], v);
  }
  first_nan = -1;
  if (nan) {
    for (i = 0; i < n; ++i) {
      if (std::isnan(float(x[i]))) {
        first_nan = i;
        break;
      }
    }
    return std::numeric_limits<float>::quiet_NaN();
  }
  return reduce_max(at::vec::maximum(at::vec::maximum(best[0], best[1]), at::vec::maximum(best[2], best[3])));
}

template <typename T>
int64_t first_index_of(const T* x, int64_t n, float value) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (const Mask hit = is_equal(load(x + i), value)) return i + first_lane(hit);
  }
  for (; i < n; ++i) {
    if (float(x[i]) == value) return i;
  }
  return 0;
}

struct Row {
  float max;
  float scale;  // log2(e) / T: y = (x - max) * scale
};

// The weights 2^y of logits x.
inline Vec weight(Vec x, Row row) { return exp2_nonpositive(bits_below_max(x, row.max, row.scale)); }

// The weights of x[start, end) into w[0, end - start).
template <typename T>
void weights_of(const T* x, int64_t start, int64_t end, Row row, float* w) {
  int64_t i = start;
  for (; i + kLanes <= end; i += kLanes) weight(load(x + i), row).store(w + (i - start));
  if (i < end) weight(load_tail(x + i, end - i), row).store(w + (i - start), end - i);
}

// An untruncated draw: one pass of block sums, then a walk through the block the target is in.
template <typename T>
int64_t draw_row(const T* x, int64_t n, Row row, double uniform, std::vector<float>& blocks) {
  double total = 0;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  for (int64_t b = 0; b < num_blocks; ++b) {
    Vec sum[2] = {Vec(0.0f), Vec(0.0f)};
    const int64_t end = std::min(n, (b + 1) * kBlock);
    int64_t i = b * kBlock;
    for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
      sum[0] = sum[0] + weight(load(x + i), row);
      sum[1] = sum[1] + weight(load(x + i + kLanes), row);
    }
    for (; i + kLanes <= end; i += kLanes) sum[0] = sum[0] + weight(load(x + i), row);
    if (i < end) sum[1] = sum[1] + weight(load_tail(x + i, end - i), row);
    blocks[b] = reduce_add(sum[0] + sum[1]);
    total += blocks[b];
  }
  // Strictly below the total, so the target lands on a token with weight.
  const double target = std::min(uniform * total, std::nextafter(total, 0.0));
  double before = 0;
  int64_t b = 0, last_with_weight = 0;
  for (; b < num_blocks; ++b) {
    if (blocks[b] > 0) last_with_weight = b;
    if (before + blocks[b] > target) break;
    before += blocks[b];
  }
  if (b == num_blocks) b = last_with_weight, before -= blocks[b];  // rounding: the last block with weight
  float w[kBlock];
  const int64_t start = b * kBlock, end = std::min(n, start + kBlock);
  weights_of(x, start, end, row, w);
  int64_t last = start;
  for (int64_t i = start; i < end; ++i) {
    if (w[i - start] <= 0) continue;
    before += w[i - start];
    last = i;
    if (before > target) return i;
  }
  return last;  // rounding between the block's vector sum and this walk: its last token with weight
}

// Every token with y >= depth, in vocabulary order: y into `values`, token ids into `ids` (each with
// kLanes of room past n); also adds every token's weight to `total` when it is given. Returns how many.
template <typename T>
int64_t collect(const T* x, int64_t n, Row row, float depth, float* values, int32_t* ids, double* total) {
  int64_t found = 0;
  Vec sum(0.0f);
  int64_t i = 0;
  // Four vectors a step: candidates are rare, so one branch on the four masks is almost always not
  // taken, where a branch per vector mispredicts and a compress to memory per vector is slow.
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    Vec y[4];
    Mask in[4];
    for (int j = 0; j < 4; ++j) {
      y[j] = bits_below_max(load(x + i + j * kLanes), row.max, row.scale);
      in[j] = at_least(y[j], depth);
      if (total) sum = sum + exp2_nonpositive(y[j]);
    }
    if (in[0] | in[1] | in[2] | in[3]) {
      for (int j = 0; j < 4; ++j)
        if (in[j]) found += compress(values + found, ids + found, in[j], y[j], int32_t(i + j * kLanes));
    }
    if (total && (i + 4 * kLanes) % kBlock == 0) *total += reduce_add(sum), sum = Vec(0.0f);
  }
  for (; i < n; i += kLanes) {
    const Vec y = bits_below_max(i + kLanes <= n ? load(x + i) : load_tail(x + i, n - i), row.max, row.scale);
    if (total) sum = sum + exp2_nonpositive(y);
    // A lane past the row's end is -inf, never at or above a depth; except the last depth, -inf.
    const Mask valid = i + kLanes <= n ? kAll : Mask((1u << (n - i)) - 1);
    if (const Mask in = at_least(y, depth) & valid) found += compress(values + found, ids + found, in, y, int32_t(i));
  }
  if (total) *total += reduce_add(sum);
  return found;
}

void exp2_all(const float* y, int64_t n, float* w) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) exp2_nonpositive(Vec::loadu(y + i)).store(w + i);
  if (i < n) exp2_nonpositive(load_tail(y + i, n - i)).store(w + i, n - i);
}

// The nucleus's floor among y[0, n) with weights w: the smallest value whose strictly better
// values weigh less than `mass` (so the best always qualifies). A quickselect that carries the
// weight of everything above the range it narrows to. Reorders y and w.
float nucleus_floor(float* y, float* w, int64_t n, double mass) {
  float floor = 0.0f;  // y's maximum: kept whatever the mass
  double above = 0;
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const float a = y[lo], b = y[lo + (hi - lo) / 2], c = y[hi - 1];
    const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));  // median of three
    // Three ways: [lo, gt) > pivot, [gt, lt) == pivot, [lt, hi) < pivot.
    int64_t gt = lo, i = lo, lt = hi;
    double mass_gt = 0, mass_eq = 0;
    while (i < lt) {
      if (y[i] > pivot) {
        mass_gt += w[i];
        std::swap(y[i], y[gt]), std::swap(w[i], w[gt]);
        ++gt, ++i;
      } else if (y[i] < pivot) {
        --lt;
        std::swap(y[i], y[lt]), std::swap(w[i], w[lt]);
      } else {
        mass_eq += w[i];
        ++i;
      }
    }
    if (above + mass_gt < mass) {  // the pivot is in: the floor is it or lower
      floor = pivot;
      above += mass_gt + mass_eq;
      lo = lt;
    } else {
      hi = gt;
    }
  }
  return floor;
}

// Per thread and kept between calls: a row's candidates can be the whole vocabulary, and
// allocating (and zeroing) that much per call would cost more than using it.
struct Scratch {
  std::vector<float> values, work, weights, blocks;
  std::vector<int32_t> ids;
  void fit(int64_t n) {
    n += kLanes;  // a compress may write a whole vector past the last candidate
    if (int64_t(values.size()) < n) values.resize(n), work.resize(n), weights.resize(n), ids.resize(n);
    blocks.resize((n + kBlock - 1) / kBlock);
  }
};

// The top-k / top-p floor (top_k in [1, n) or 0 = off; top_p < 1 or 1 = off). Leaves the tokens
// it looked at in s.values / s.ids (vocabulary order) and returns how many.
template <typename T>
int64_t top_k_top_p(const T* x, int64_t n, Row row, int64_t top_k, float top_p, Scratch& s, float& floor) {
  double total = 0;  // top-p alone renormalises over the whole row: summed in the first pass
  for (const float depth : kDepths) {
    const int64_t found = collect(x, n, row, depth, s.values.data(), s.ids.data(),
                                  top_k == 0 && depth == kDepths[0] ? &total : nullptr);
    if (depth > -kInf && found < top_k) continue;  // fewer than k tokens this close: look deeper
    float* work = s.work.data();
    std::copy(s.values.begin(), s.values.begin() + found, work);
    int64_t kept = found;
    if (top_k > 0) {
      std::nth_element(work, work + (top_k - 1), work + found, std::greater<float>());
      floor = work[top_k - 1];
      if (top_p >= 1.0f) return found;
      kept = top_k;  // top-p within the k best, renormalised over them
    }
    exp2_all(work, kept, s.weights.data());
    double kept_mass = 0;
    for (int64_t i = 0; i < kept; ++i) kept_mass += s.weights[i];
    const double mass = top_p * (top_k > 0 ? kept_mass : total);
    // Unless every token is a candidate, the nucleus must close inside the candidates.
    if (depth > -kInf && top_k == 0 && kept_mass < mass) continue;
    floor = nucleus_floor(work, s.weights.data(), kept, mass);
    return found;
  }
  return 0;  // not reached: the last depth takes every token
}

// The inverse CDF over the candidates with y >= floor (vocabulary order): two short passes.
int64_t draw_candidates(const float* y, const int32_t* ids, int64_t n, float floor, double uniform, float* w) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec v = Vec::loadu(y + i);
    where_at_least(v, floor, exp2_nonpositive(v)).store(w + i);
  }
  if (i < n) {
    const Vec v = load_tail(y + i, n - i);
    where_at_least(v, floor, exp2_nonpositive(v)).store(w + i, n - i);
  }
  double total = 0;
  for (i = 0; i < n; ++i) total += w[i];
  const double target = std::min(uniform * total, std::nextafter(total, 0.0));
  double before = 0;
  int64_t last = 0;
  for (i = 0; i < n; ++i) {
    if (w[i] <= 0) continue;
    before += w[i];
    last = i;
    if (before > target) return ids[i];
  }
  return ids[last];
}

template <typename T>
void sample_rows_typed(const T* logits, int64_t row_stride, int64_t rows, int64_t n, const float* inv_t,
                       const float* uniforms, const int64_t* top_k, const float* top_p, const float* min_p,
                       int64_t* tokens) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch s;
    s.fit(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* x = logits + r * row_stride;
      int64_t first_nan;
      const float max = row_max(x, n, first_nan);
      if (first_nan >= 0) {
        tokens[r] = first_nan;
        continue;
      }
      if (inv_t[r] == 0.0f || !std::isfinite(max)) {
        tokens[r] = first_index_of(x, n, max);
        continue;
      }
      const Row row{max, inv_t[r] * kLog2e};
      const int64_t k = top_k[r] > 0 && top_k[r] < n ? top_k[r] : 0;  // k >= n keeps every token
      const float min_p_floor = min_p[r] > 0.0f ? std::log2(min_p[r]) : -kInf;
      if (k == 0 && top_p[r] >= 1.0f && min_p[r] <= 0.0f) {
        tokens[r] = draw_row(x, n, row, uniforms[r], s.blocks);
        continue;
      }
      float floor = -kInf;
      int64_t found;
      if (k > 0 || top_p[r] < 1.0f) {
        found = top_k_top_p(x, n, row, k, top_p[r], s, floor);
      } else {  // min-p alone: its floor is known before looking
        found = collect(x, n, row, min_p_floor, s.values.data(), s.ids.data(), nullptr);
      }
      floor = std::max(floor, min_p_floor);
      tokens[r] = draw_candidates(s.values.data(), s.ids.data(), found, floor, uniforms[r], s.weights.data());
    }
  });
}

at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& inv_temperature, const at::Tensor& uniforms,
                       const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "logits must be [rows, vocab] with unit column stride");
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(n > 0 && n < (int64_t(1) << 31), "logits must have between 1 and 2^31 - 1 columns");
  for (const at::Tensor* t : {&inv_temperature, &uniforms, &top_k, &top_p, &min_p}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == rows && t->is_contiguous(), "per-row parameters must be [rows]");
  }
  TORCH_CHECK(inv_temperature.scalar_type() == at::kFloat && uniforms.scalar_type() == at::kFloat &&
                  top_p.scalar_type() == at::kFloat && min_p.scalar_type() == at::kFloat &&
                  top_k.scalar_type() == at::kLong,
              "inv_temperature, uniforms, top_p, min_p must be float32 and top_k int64");
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  auto run = [&](const auto* x) {
    sample_rows_typed(x, logits.stride(0), rows, n, inv_temperature.data_ptr<float>(), uniforms.data_ptr<float>(),
                      top_k.data_ptr<int64_t>(), top_p.data_ptr<float>(), min_p.data_ptr<float>(),
                      tokens.data_ptr<int64_t>());
  };
  if (logits.scalar_type() == at::kFloat) {
    run(logits.data_ptr<float>());
  } else if (logits.scalar_type() == at::kBFloat16) {
    run(logits.data_ptr<at::BFloat16>());
  } else {
    TORCH_CHECK(false, "logits must be float32 or bfloat16, got ", logits.scalar_type());
  }
  return tokens;
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def(
      "sample_rows(Tensor logits, Tensor inv_temperature, Tensor uniforms, Tensor top_k, Tensor top_p, "
      "Tensor min_p) -> Tensor");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("sample_rows", &sample_rows); }
