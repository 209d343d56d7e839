// Linear layers and embedding lookups over GGUF-quantized weights, kept in their stored blocks.
//
//   quant_linear(x [M, K] float32, qweight [N, row_bytes] uint8, int type, bias?, int mode=0) -> [M, N] float32
//   quant_rows(qweight [N, row_bytes] uint8, int type, ids [T] int64, int K) -> [T, K] float32
//
// `qweight` is the GGUF tensor's bytes as stored, one row of blocks per output feature; `type` is the
// GGML type number: 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K,
// 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS, 30 BF16 (the formats: quant_formats.h). Any view whose rows are
// contiguous runs of bytes will do (its row stride is read from the tensor): a contiguous run of rows of
// a bigger tensor (one expert of a 3-D [experts, N, row_bytes] tensor, or part of its rows) is used in
// place, with no copy.
//
// Types 102, 103, 106, 108, 112, 113 and 114 are Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K with every 8
// output rows interleaved (quant_interleaved.cpp):
//   interleave_rows(qweight [N, row_bytes] uint8, int type) -> the same bytes interleaved (N a multiple of 8)
//   interleaved_type(int type) -> 100 + type where this build runs int8 tiles over that layout, else 0
// The loader interleaves a Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K linear in int8 mode where interleaved_type says so;
// every op takes the layouts on every path (elsewhere through the stored blocks, deinterleaved per call).
//
// Decoding is memory-bandwidth bound: a step reads every weight once, so Q4_1 reads 0.625 bytes a
// weight where float32 reads 4. Below kPanelRows rows the weights are decoded inside the dot products
// and never written back out (the tiles, quant_float.cpp); from there a panel of rows at a time is
// decoded into a scratch buffer for a float32 GEMM (the panels, quant_float.cpp).
//
// mode 0 (the default), float32 activations: results within float rounding of the dequantized reference.
//
// modes 1-3, int8 activations (1: below kPanelRows, the panels from there; 2: always; 3: always,
// without VNNI; quant_int8.cpp): each activation row quantized to int8 per 32-block, then integer dot
// products with the codes. This is what llama.cpp does (its Q8_0/Q8_1 activations), so it is the fair comparison
// with it; it moves each output by up to (max|x| of each block / 254) * sum|w| of the block (~0.5%
// relative on the tiny models' linears), which flips greedy near-ties: on the bundled SmolLM2 3 of 8
// 16-token greedy outputs stayed equal to the float32 reference's where the float path holds 7 of 8. So
// it is opt-in (the worker: PAGEDSERVE_QUANT_ACTIVATIONS=int8). At 64 rows the compute-bound step has
// fewer instructions per product: 4 per 64 multiply-adds (vpdpbusd, cvt, scale mul, FMA) against the
// float path's 4 FMAs per 64 plus the per-tile decode. F16 and BF16 weights have no integer codes: every
// mode runs them as mode 0 does.
//
// One source, three ISA paths (kernels/cpu/isa.py), over ATen's at::vec::Vectorized<float>: see each
// driver's header for what avx512, avx2 and portable do. Measured: docs/cpu-performance.md
// (ops/microbench/quant_linear_ab.py).
#include <torch/types.h>

#include "library.h"
#include "quant_linear.h"

namespace {

using namespace quant;

// Rows from which modes 0 and 1 run the panel path (measured: see quant_float.cpp's panel comment). Mode
// 1 runs int8 below it, from the first row: until Dec 2026 from 8 rows, when the avx2 path at one row
// ran no faster than float (its scales were copied out per weight row first); now int8 is as fast or
// faster at every row count below the panels on every ISA path, and the panels' float32 GEMM faster
// from there (a 512-token prefill of the 1B MoE: 2.6 s in int8 against 1.75 s, Zen 3;
// docs/cpu-performance.md).
constexpr int64_t kPanelRows = 24;

// Mode 1's switch to the panels, per type: where the avx2 path takes Q4_0 and Q4_1 two groups per
// register (quant_int8.cpp's pair_impl), its int8 tiles beat the panels far beyond 24 rows (AMD EPYC Zen
// 3, 2 threads, Q4_0, min ms of 3 runs, int8 / panels: 3072x1024 at 384 rows 11.5 / 15.9, 512 15.8 /
// 20.5, 1024 31.7 / 39.5; 1024x2048 at 512 14.2 / 13.8, 1024 27.5 / 26.2), so they keep the tiles below
// 1024 rows.
constexpr int64_t kPairedPanelRows = 1024;

// The same for the avx2 path's K-quants, a super-block at a time (quant_int8.cpp's superblock_tile): their
// int8 tiles beat the panels to 64 rows and lose from ~128 (AMD EPYC Zen 3, 2 threads, a 2048 x 5632
// linear, best ms, int8 / panels: Q4_K at 24 rows 4.2 / 8.8, 64 15.1 / 28.0, 128 32.5 / 28.0, 256 70.7 /
// 54.2; Q6_K 4.8 / 7.2, 12.5 / 24.5, 39.6 / 31.4, 59.6 / 54.1; a 1024 x 2048 Q4_K at 128 rows 4.8 / 5.9).
constexpr int64_t kSuperblockPanelRows = 96;

// Mode 1's switch for the interleaved layouts where this build has their int8 tiles: they beat the
// panels' float32 GEMM to ~1000 rows for Q4_0, Q4_1 and Q4_K and to ~512 for Q8_0 and Q6_K (AMD EPYC Zen
// 3, 2 threads, best ms of 3, interleaved int8 / panels: Q4_0 3072x1024 at 1000 rows 19.8 / 35.6,
// 1024x2048 13.5 / 23.7; Q4_K 2048x5632 at 1000 112 / 162, 3072x3072 92 / 124; Q8_0 3072x1024 at 512
// 19.0 / 19.7, at 1000 43.9 / 37.3, 3072x3072 at 512 51.7 / 65.1; Q6_K 2048x5632 at 512 71 / 83,
// 1024x2048 at 512 13.8 / 12.8, at 1000 26.0 / 23.9).
// Q5_K (Q4_K's tile with a fifth bit) takes Q4_K's switch, not measured on its own.
constexpr int64_t kInterleavedPanelRows = 1024, kInterleavedWidePanelRows = 512;

// Mode 1's switch for the other types on the avx512 path: its stored-layout int8 tiles (8 rows x 2
// outputs, vpdpbusd) beat the panels' float32 GEMM to ~128 rows (AMD EPYC Zen 4, whose 512-bit FMAs
// take two passes, 2 threads, least us of 9, int8 / panels: Q5_0 1536x576 at 64 rows 736 / 944, at 128
// 1514 / 1571, at 256 2808 / 2716; 2048x2048 at 128 5825 / 8096; Q8_0 576x1536 at 128 1199 / 1570; the
// narrowest, 576x576, loses from 128: 743 / 602). With 24 rows a Q4_K_M SmolLM2 (mostly Q5_0) served 64
// requests at 0.61x llama-server's speed there. Not measured again on an Intel Xeon.
constexpr int64_t kWidePanelRows = 128;

int64_t int8_panel_rows(int64_t type) {
  if (interleaved(type))
    return !int8_interleaved()  ? int8_panel_rows(stored_type(type))
           : type == Q8_0_R8 || type == Q6_K_R8 ? kInterleavedWidePanelRows
                                                : kInterleavedPanelRows;
  if (int8_pairs_groups(type)) return kPairedPanelRows;
  if (int8_superblock_tiles(type)) return kSuperblockPanelRows;
#if defined(CPU_CAPABILITY_AVX512)
  return kWidePanelRows;
#else
  return kPanelRows;
#endif
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

void check_weight(const char* op, const at::Tensor& qweight, int64_t type, int64_t K) {
  TORCH_CHECK(supported(stored_type(type)), op, ": GGML type ", type,
              " is not supported (F16=1, Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q2_K=10, Q3_K=11, Q4_K=12, "
              "Q5_K=13, Q6_K=14, IQ4_NL=20, IQ4_XS=23, BF16=30; Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K "
              "interleaved by 8 rows: 102, 103, 106, 108, 112, 113, 114)");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kByte && qweight.stride(1) == 1 &&
                  (qweight.size(0) <= 1 || qweight.stride(0) >= qweight.size(1)),
              op, ": qweight must be a 2-D uint8 tensor whose rows are contiguous");
  const int64_t stored = stored_type(type);
  // A group of 32 is the kernel's unit: the types' blocks are 32 or 256 weights, F16/BF16's one.
  const int64_t unit = std::max(block_weights(stored), kGroup);
  TORCH_CHECK(K % unit == 0, op, ": in_features ", K, " is not a multiple of ", unit,
              block_weights(stored) > 1 ? " (the type's block)" : " (the kernel's group of weights)");
  const int64_t row_bytes = K / block_weights(stored) * block_bytes(stored);
  TORCH_CHECK(qweight.size(1) == row_bytes, op, ": a row of ", K, " weights of type ", type, " is ", row_bytes,
              " bytes, qweight has ", qweight.size(1));
  if (interleaved(type))
    TORCH_CHECK(qweight.size(0) % kInterleavedRows == 0 && (qweight.size(0) <= 1 || qweight.stride(0) == row_bytes),
                op, ": interleaved rows (type ", type, ") come in whole chunks of ", kInterleavedRows,
                " contiguous rows; qweight has ", qweight.size(0), " rows of stride ", qweight.stride(0));
}

// The stored blocks of interleaved rows: rows ids[t] -> [count, row_bytes] (for the paths that read
// the GGML layout).
at::Tensor stored_rows(const at::Tensor& qweight, int64_t type, const int64_t* ids, int64_t count) {
  at::Tensor rows = at::empty({count, qweight.size(1)}, qweight.options());
  deinterleave_rows(stored_type(type), qweight.data_ptr<uint8_t>(), qweight.size(1), ids, count,
                    rows.data_ptr<uint8_t>());
  return rows;
}

at::Tensor all_stored_rows(const at::Tensor& qweight, int64_t type) {
  const at::Tensor ids = at::arange(qweight.size(0), qweight.options().dtype(at::kLong));
  return stored_rows(qweight, type, ids.data_ptr<int64_t>(), qweight.size(0));
}

// mode: 0 float32 activations (the default: results within float rounding of the dequantized
// reference; tiles below kPanelRows rows, panels from there), 1 int8 activations below kPanelRows and
// the float32 panels from there, 2 int8 activations at any row count, 3 int8 activations without VNNI
// (avx512's maddubs form, which the tests run on a VNNI CPU too), 4 float32 tiles and 5 float32 panels
// at any row count (tests and A/B runs of the two float paths).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qweight, int64_t type,
                        const c10::optional<at::Tensor>& bias, int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= 5, "quant_linear: mode must be 0-5, got ", mode);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "quant_linear: x must be 2-D float32");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = qweight.size(0);
  check_weight("quant_linear", qweight, type, K);
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == N, "quant_linear: bias must be float32 [N]");
  }
  at::Tensor out = at::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return out;
  if (interleaved(type)) {
    const bool tiles = int8_interleaved() && (mode == 2 || mode == 3 || (mode == 1 && M < int8_panel_rows(type)));
    if (!tiles) return quant_linear(xc, all_stored_rows(qweight, type), stored_type(type), bias, mode);
    linear_interleaved_int8(type, xc.data_ptr<float>(), M, K, qweight.data_ptr<uint8_t>(),
                            b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<float>(), N,
                            mode != 3 && cpu_has_vnni());
    return out;
  }
  if (float_weights(type) && mode >= 1 && mode <= 3) mode = 0;  // no codes to take int8 products with
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  const int64_t stride = qweight.size(0) > 1 ? qweight.stride(0) : qweight.size(1);
  const int64_t panel_rows = mode == 1 ? int8_panel_rows(type) : kPanelRows;
  const bool integer = mode == 2 || mode == 3 || (mode == 1 && M < panel_rows);
  if (mode == 5 || ((mode == 0 || mode == 1) && M >= panel_rows))
    linear_panels(type, xc, w, stride, b, out);
  else if (integer)
    linear_int8(type, xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N, mode != 3 && cpu_has_vnni());
  else
    linear_tiles(type, xc.data_ptr<float>(), M, K, w, stride, bp, out.data_ptr<float>(), N);
  return out;
}

at::Tensor quant_rows(const at::Tensor& qweight, int64_t type, const at::Tensor& ids, int64_t K) {
  check_weight("quant_rows", qweight, type, K);
  TORCH_CHECK(ids.scalar_type() == at::kLong, "quant_rows: ids must be int64");
  const at::Tensor idc = ids.contiguous();
  const int64_t count = idc.numel(), N = qweight.size(0);
  const int64_t* id = idc.data_ptr<int64_t>();
  for (int64_t t = 0; t < count; ++t)
    TORCH_CHECK(id[t] >= 0 && id[t] < N, "quant_rows: id ", id[t], " is outside [0, ", N, ")");
  at::Tensor out = at::empty({count, K}, idc.options().dtype(at::kFloat));
  if (interleaved(type)) {
    const at::Tensor rows = stored_rows(qweight, type, id, count);
    const at::Tensor own = at::arange(count, idc.options());
    decode_rows(stored_type(type), rows.data_ptr<uint8_t>(), rows.size(1), own.data_ptr<int64_t>(), count, K,
                out.data_ptr<float>());
    return out;
  }
  const int64_t stride = qweight.size(0) > 1 ? qweight.stride(0) : qweight.size(1);
  decode_rows(type, qweight.data_ptr<uint8_t>(), stride, id, count, K, out.data_ptr<float>());
  return out;
}

at::Tensor interleave_rows_op(const at::Tensor& qweight, int64_t type) {
  TORCH_CHECK(interleaved_layout(type) != 0, "interleave_rows: type ", type,
              " has no interleaved layout (Q4_0=2, Q4_1=3, Q5_0=6, Q8_0=8, Q4_K=12, Q5_K=13 and Q6_K=14 have)");
  TORCH_CHECK(qweight.dim() == 2 && qweight.size(1) % block_bytes(type) == 0, "interleave_rows: qweight must be ",
              "[rows, row_bytes] with whole blocks of type ", type);
  check_weight("interleave_rows", qweight, type, qweight.size(1) / block_bytes(type) * block_weights(type));
  TORCH_CHECK(qweight.size(0) % kInterleavedRows == 0, "interleave_rows: ", qweight.size(0),
              " rows are not whole chunks of ", kInterleavedRows);
  const at::Tensor rows = qweight.contiguous();
  at::Tensor out = at::empty_like(rows);
  interleave_rows(type, rows.data_ptr<uint8_t>(), rows.size(0), rows.size(1), out.data_ptr<uint8_t>());
  return out;
}

int64_t interleaved_type(int64_t type) { return int8_interleaved() ? interleaved_layout(type) : 0; }

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def("quant_linear(Tensor x, Tensor qweight, int type, Tensor? bias, int mode=0) -> Tensor");
  m.def("quant_rows(Tensor qweight, int type, Tensor ids, int in_features) -> Tensor");
  m.def("int8_panel_rows(int type) -> int", &int8_panel_rows);  // no tensor to dispatch on
  m.def("interleaved_type(int type) -> int", &interleaved_type);
  m.def("interleave_rows(Tensor qweight, int type) -> Tensor");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) {
  m.impl("quant_linear", &quant_linear);
  m.impl("quant_rows", &quant_rows);
  m.impl("interleave_rows", &interleave_rows_op);
}
