// One token per row of logits for the CPU sampler (services/worker/sampler.py): two or three
// passes over each row, in place, instead of the torch path's dozen tensor ops and full-size
// temporaries.
//
// pagedserve_sampling::sample_rows(logits [R, V] float32 | bfloat16, inv_temperature [R] float32
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

#include <ATen/Parallel.h>
#include "library.h"
#include <torch/types.h>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define SAMPLING_AVX512 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kBlock = 256;  // tokens per partial sum of an untruncated draw (a multiple of kLanes)
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kDepths[] = {-12.0f, -24.0f, -48.0f, -kInf};  // top-k / top-p candidates: y >= depth

#ifdef SAMPLING_AVX512

using Vec = __m512;
using Mask = __mmask16;

inline Mask lanes_mask(int64_t remaining) {
  return remaining >= kLanes ? Mask(0xFFFF) : Mask((1u << remaining) - 1);
}
// 16 logits as float; lanes past the row's end hold -inf.
inline Vec load(const float* p, Mask valid) { return _mm512_mask_loadu_ps(_mm512_set1_ps(-kInf), valid, p); }
inline Vec load(const uint16_t* p, Mask valid) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(valid, p));
  const Vec v = _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));  // bfloat16 is float's top half
  return _mm512_mask_blend_ps(valid, _mm512_set1_ps(-kInf), v);
}
inline Vec bits_below_max(Vec x, float max, float scale) {
  return _mm512_mul_ps(_mm512_sub_ps(x, _mm512_set1_ps(max)), _mm512_set1_ps(scale));
}
// 2^y for y <= 0 (and -inf): 2^n * 2^f with |f| <= 1/2, e^(f ln2) to degree 6 (~1 ulp). Clamped
// at -160, where it is exactly 0: a masked (-inf) token must weigh nothing, not a denormal.
inline Vec exp2_nonpositive(Vec y) {
  y = _mm512_max_ps(y, _mm512_set1_ps(-160.0f));
  const Vec n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec f = _mm512_sub_ps(y, n);
  Vec p = _mm512_set1_ps(1.5403530393381606e-4f);  // ln2^6 / 6!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vfill(float v) { return _mm512_set1_ps(v); }
inline Vec keep(Mask m, Vec v) { return _mm512_maskz_mov_ps(m, v); }
inline float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }
inline float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
inline Mask is_nan(Vec v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
inline Mask is_equal(Vec v, float x) { return _mm512_cmp_ps_mask(v, _mm512_set1_ps(x), _CMP_EQ_OQ); }
inline Mask at_least(Vec v, float x) { return _mm512_cmp_ps_mask(v, _mm512_set1_ps(x), _CMP_GE_OQ); }
inline int first_lane(Mask m) { return __builtin_ctz(unsigned(m)); }
inline int count(Mask m) { return __builtin_popcount(unsigned(m)); }
inline void store(float* out, Vec v) { _mm512_storeu_ps(out, v); }
// Appends the lanes of `v` picked by `m`, and their token ids (`first` + lane), in lane order.
inline int compress(float* values, int32_t* ids, Mask m, Vec v, int32_t first) {
  _mm512_mask_compressstoreu_ps(values, m, v);
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  _mm512_mask_compressstoreu_epi32(ids, m, _mm512_add_epi32(_mm512_set1_epi32(first), lanes));
  return count(m);
}

#else  // portable: the same operations lane by lane

struct Vec {
  float v[kLanes];
};
using Mask = uint32_t;

inline Mask lanes_mask(int64_t remaining) {
  return remaining >= kLanes ? Mask(0xFFFF) : Mask((1u << remaining) - 1);
}
inline float as_float(float x) { return x; }
inline float as_float(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof x);
  return x;
}
template <typename T>
inline Vec load(const T* p, Mask valid) {
  Vec r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = (valid >> i & 1) ? as_float(p[i]) : -kInf;
  return r;
}
template <typename F>
inline Vec map(Vec a, F f) {
  for (float& x : a.v) x = f(x);
  return a;
}
inline Vec bits_below_max(Vec x, float max, float scale) {
  return map(x, [=](float v) { return (v - max) * scale; });
}
inline Vec exp2_nonpositive(Vec y) { return map(y, [](float x) { return std::exp2(x); }); }
inline Vec vmax(Vec a, Vec b) {
  for (int i = 0; i < kLanes; ++i) a.v[i] = std::max(a.v[i], b.v[i]);
  return a;
}
inline Vec vadd(Vec a, Vec b) {
  for (int i = 0; i < kLanes; ++i) a.v[i] += b.v[i];
  return a;
}
inline Vec vfill(float x) {
  Vec r;
  std::fill(r.v, r.v + kLanes, x);
  return r;
}
inline Vec keep(Mask m, Vec v) {
  for (int i = 0; i < kLanes; ++i) v.v[i] = (m >> i & 1) ? v.v[i] : 0.0f;
  return v;
}
inline float reduce_max(Vec v) { return *std::max_element(v.v, v.v + kLanes); }
inline float reduce_add(Vec v) {
  float s = 0;
  for (float x : v.v) s += x;
  return s;
}
template <typename P>
inline Mask lanes_where(Vec v, P pred) {
  Mask m = 0;
  for (int i = 0; i < kLanes; ++i) m |= Mask(pred(v.v[i])) << i;
  return m;
}
inline Mask is_nan(Vec v) { return lanes_where(v, [](float x) { return std::isnan(x); }); }
inline Mask is_equal(Vec v, float y) { return lanes_where(v, [=](float x) { return x == y; }); }
inline Mask at_least(Vec v, float y) { return lanes_where(v, [=](float x) { return x >= y; }); }
inline int first_lane(Mask m) { return __builtin_ctz(m); }
inline int count(Mask m) { return __builtin_popcount(m); }
inline void store(float* out, Vec v) { std::copy(v.v, v.v + kLanes, out); }
inline int compress(float* values, int32_t* ids, Mask m, Vec v, int32_t first) {
  int n = 0;
  for (int i = 0; i < kLanes; ++i)
    if (m >> i & 1) values[n] = v.v[i], ids[n++] = first + i;
  return n;
}

#endif

// The row's maximum, or NaN with `first_nan` set. Four accumulators: max's latency, not its
// throughput, would otherwise bound the pass.
template <typename T>
float row_max(const T* x, int64_t n, int64_t& first_nan) {
  Vec best[4] = {vfill(-kInf), vfill(-kInf), vfill(-kInf), vfill(-kInf)};
  Mask nan = 0;
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int j = 0; j < 4; ++j) {
      const Vec v = load(x + i + j * kLanes, Mask(0xFFFF));
      nan |= is_nan(v);
      best[j] = vmax(best[j], v);
    }
  }
  for (; i < n; i += kLanes) {
    const Vec v = load(x + i, lanes_mask(n - i));
    nan |= is_nan(v);
    best[0] = vmax(best[0], v);
  }
  first_nan = -1;
  if (nan) {
    for (i = 0; i < n; i += kLanes) {
      if (const Mask hit = is_nan(load(x + i, lanes_mask(n - i)))) {
        first_nan = i + first_lane(hit);
        break;
      }
    }
    return std::numeric_limits<float>::quiet_NaN();
  }
  return reduce_max(vmax(vmax(best[0], best[1]), vmax(best[2], best[3])));
}

template <typename T>
int64_t first_index_of(const T* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const Mask valid = lanes_mask(n - i);
    if (const Mask hit = is_equal(load(x + i, valid), value) & valid) return i + first_lane(hit);
  }
  return 0;
}

struct Row {
  float max;
  float scale;  // log2(e) / T: y = (x - max) * scale
};

// An untruncated draw: one pass of block sums, then a walk through the block the target is in.
template <typename T>
int64_t draw_row(const T* x, int64_t n, Row row, double uniform, std::vector<float>& blocks) {
  double total = 0;
  for (int64_t b = 0; b * kBlock < n; ++b) {
    Vec sum[2] = {vfill(0.0f), vfill(0.0f)};
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock, j = 0; i < end; i += kLanes, j ^= 1) {
      sum[j] = vadd(sum[j], exp2_nonpositive(bits_below_max(load(x + i, lanes_mask(end - i)), row.max, row.scale)));
    }
    blocks[b] = reduce_add(vadd(sum[0], sum[1]));
    total += blocks[b];
  }
  // Strictly below the total, so the target lands on a token with weight.
  const double target = std::min(uniform * total, std::nextafter(total, 0.0));
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
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
  for (int64_t i = start; i < end; i += kLanes) {
    store(w + (i - start), exp2_nonpositive(bits_below_max(load(x + i, lanes_mask(end - i)), row.max, row.scale)));
  }
  int64_t last = start;
  for (int64_t i = start; i < end; ++i) {
    if (w[i - start] <= 0) continue;
    before += w[i - start];
    last = i;
    if (before > target) return i;
  }
  return last;  // rounding between the block's vector sum and this walk: its last token with weight
}

// Every token with y >= depth, in vocabulary order: y into `values`, token ids into `ids`; also
// adds every token's weight to `total` when it is given. Returns how many.
template <typename T>
int64_t collect(const T* x, int64_t n, Row row, float depth, float* values, int32_t* ids, double* total) {
  int64_t found = 0;
  Vec sum = vfill(0.0f);
  int64_t i = 0;
  // Four vectors a step: candidates are rare, so one branch on the four masks is almost always not
  // taken, where a branch per vector mispredicts and a compress to memory per vector is slow.
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    Vec y[4];
    Mask in[4];
    for (int j = 0; j < 4; ++j) {
      y[j] = bits_below_max(load(x + i + j * kLanes, Mask(0xFFFF)), row.max, row.scale);
      in[j] = at_least(y[j], depth);
      if (total) sum = vadd(sum, exp2_nonpositive(y[j]));
    }
    if (in[0] | in[1] | in[2] | in[3]) {
      for (int j = 0; j < 4; ++j)
        if (in[j]) found += compress(values + found, ids + found, in[j], y[j], int32_t(i + j * kLanes));
    }
    if (total && (i + 4 * kLanes) % kBlock == 0) *total += reduce_add(sum), sum = vfill(0.0f);
  }
  for (; i < n; i += kLanes) {
    const Mask valid = lanes_mask(n - i);
    const Vec y = bits_below_max(load(x + i, valid), row.max, row.scale);
    if (total) sum = vadd(sum, exp2_nonpositive(y));
    if (const Mask in = at_least(y, depth) & valid) found += compress(values + found, ids + found, in, y, int32_t(i));
  }
  if (total) *total += reduce_add(sum);
  return found;
}

void exp2_all(const float* y, int64_t n, float* w) {
  for (int64_t i = 0; i < n; i += kLanes) {
    float lanes[kLanes];
    store(lanes, exp2_nonpositive(load(y + i, lanes_mask(n - i))));
    std::copy(lanes, lanes + std::min<int64_t>(kLanes, n - i), w + i);
  }
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
  double total = 0;
  for (int64_t i = 0; i < n; i += kLanes) {
    const Mask valid = lanes_mask(n - i);
    const Vec v = load(y + i, valid);
    const Vec e = keep(at_least(v, floor) & valid, exp2_nonpositive(v));
    float lanes[kLanes];
    store(lanes, e);
    std::copy(lanes, lanes + std::min<int64_t>(kLanes, n - i), w + i);
  }
  for (int64_t i = 0; i < n; ++i) total += w[i];
  const double target = std::min(uniform * total, std::nextafter(total, 0.0));
  double before = 0;
  int64_t last = 0;
  for (int64_t i = 0; i < n; ++i) {
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
    run(reinterpret_cast<const uint16_t*>(logits.data_ptr<at::BFloat16>()));
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
