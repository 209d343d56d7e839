// One decoder layer of the Llama family over GGUF-quantized or float32 weights, in one op: the same
// kernels the Python layer calls (services/worker/models/llama.py, layers/attention.py, mlp.py, moe.py),
// called here one after the other through the dispatcher, so its output is the Python layer's to the bit.
//
//   decoder_layer(x, residual?, cos, sin, k_cache, v_cache, slot_mapping, query_start_loc, seq_lens,
//                 block_tables, lora_rows?, tensors, ints, floats) -> (the MLP's output, the residual stream)
//
// Why: a one-request decode step of the bundled model spent ~4.5 ms of its ~14 (AMD EPYC Zen 3, 2
// threads) between its 14 kernel calls a layer: each a Python round trip, argument parsing and a
// profiler-visible dispatch. Here a layer is one Python call; its kernels are reached from C++.
//
// The layer, as the Python one runs it:
//   h, res = norm(x), x  (first layer)  |  h, res = add_and_norm(x, residual)
//   qkv = linear(h); q, k, v = its heads; q, k = q_norm(q), k_norm(k) where the model has them
//   rotary(q, k); write_kv(k, v); out = paged_attention(q); o = linear(out)
//   h2, res = add_and_norm(o, res)              Gemma: h2, res = add_and_norm(norm(o), res)
//   dense: down(silu(gate) * up)  |  MoE: route, then the experts' op (moe_experts.cpp)
//   Gemma: down(gelu_tanh(gate) * up), then normalised (models/gemma.py's four norms a layer)
//
// tensors (Tensor?[]): input norm, post-attention norm, q norm?, k norm?, router?, attention output norm?
//   and MLP output norm? (Gemma's; the post-attention norm is then its pre-feedforward one), then per
//   linear (q/k/v, o, gate/up, down) its bias?, its weight (a GGUF linear: its runs' blocks; a fused projection stored
//   in several types runs each type over its own rows, their outputs joined, the bias sliced to match)
//   and, where adapters target it, its LoRA stacks: A, then each part's B (layers/lora.py's LoRALinear).
// ints: heads, kv heads, head dim, window (0: none), activation mode, top_k (0: dense MLP), normalize,
//   experts, GELU-tanh MLP (0: SiLU), then per linear its kind (a GGUF linear's number of runs, then
//   each run's type; kDense or kPacked: one float32 weight) and its number of LoRA parts (0: none).
// lora_rows: this step's slot per row (-1: the base model) when a row has an adapter; each adapted linear
//   then adds the rows' deltas with the LoRA kernel (lora.cpp), after its bias, as LoRALinear does.
// floats: input norm eps, post-attention norm eps, q/k norm eps, scale, softcap (0: none).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include "library.h"

#include <cstring>
#include <string>
#include <vector>

namespace {

// Another extension's op on this build's ISA path: "pagedserve_decoder_layer_avx2" -> the namespace
// "pagedserve_<extension>_avx2". The Python side fuses a layer only where every kernel it calls runs on
// that same path (layers/fused_layer.py).
template <typename Signature>
c10::TypedOperatorHandle<Signature> kernel(const char* extension, const char* op) {
  static const std::string self = PAGEDSERVE_LIBRARY_NAME;
  static const std::string isa = self.substr(std::strlen("pagedserve_decoder_layer_"));
  const std::string name = std::string("pagedserve_") + extension + "_" + isa + "::" + op;
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<Signature>();
}

using Opt = c10::optional<at::Tensor>;

using T = at::Tensor;
using QuantLinear = T(const T&, const T&, int64_t, const Opt&, int64_t);
using MoeExperts = T(const T&, const T&, const T&, const T&, int64_t, const T&, int64_t, int64_t, int64_t);
using RmsNorm = T(const T&, const T&, double);
using AddRmsNorm = void(T&, T&, const T&, double);
using SiluAndMul = T(const T&);
using Rotary = void(T&, const T&, const T&);
using MoeRoute = std::tuple<T, T>(const T&, const T&, int64_t, bool);
using WriteKV = void(const T&, const T&, T&, T&, const T&);
using PagedAttention = void(const T&, const T&, const T&, const T&, const T&, const T&, double, int64_t, double, T&);

struct Kernels {
  c10::TypedOperatorHandle<RmsNorm> rms_norm = kernel<RmsNorm>("layer_ops", "rms_norm");
  c10::TypedOperatorHandle<AddRmsNorm> add_rms_norm = kernel<AddRmsNorm>("layer_ops", "fused_add_rms_norm");
  c10::TypedOperatorHandle<SiluAndMul> silu_and_mul = kernel<SiluAndMul>("layer_ops", "silu_and_mul");
  c10::TypedOperatorHandle<Rotary> rotary_ = kernel<Rotary>("layer_ops", "rotary_");
  c10::TypedOperatorHandle<MoeRoute> moe_route = kernel<MoeRoute>("layer_ops", "moe_route");
  c10::TypedOperatorHandle<WriteKV> write_kv = kernel<WriteKV>("paged_attention", "write_kv");
  c10::TypedOperatorHandle<PagedAttention> paged_attention = kernel<PagedAttention>("paged_attention", "paged_attention");
};

// Looked up on the first call (the other extensions are loaded by then), once per process.
const Kernels& kernels() {
  static const Kernels k;
  return k;
}

// The kernels of some layers only, looked up on their first use: a process that runs no GGUF weights,
// no MoE or no adapters need not have loaded their extensions.
const c10::TypedOperatorHandle<QuantLinear>& quant_linear() {
  static const auto op = kernel<QuantLinear>("quant_linear", "quant_linear");
  return op;
}
const c10::TypedOperatorHandle<MoeExperts>& moe_experts() {
  static const auto op = kernel<MoeExperts>("quant_linear", "moe_experts");
  return op;
}
using LoraDelta = void(T&, const T&, const T&, at::TensorList, const T&);
const c10::TypedOperatorHandle<LoraDelta>& lora_delta() {
  static const auto op = kernel<LoraDelta>("lora", "lora_delta_");
  return op;
}

// Reads the flat argument lists in order.
struct Args {
  const c10::List<Opt>& tensors;
  c10::IntArrayRef ints;
  size_t t = 0, i = 0;

  Opt tensor() {
    TORCH_CHECK(t < tensors.size(), "decoder_layer: fewer tensors than the layer's layout needs");
    return tensors.get(t++);
  }
  at::Tensor required() {
    Opt x = tensor();
    TORCH_CHECK(x.has_value() && x->defined(), "decoder_layer: tensor ", t - 1, " is required");
    return *x;
  }
  int64_t integer() {
    TORCH_CHECK(i < ints.size(), "decoder_layer: fewer ints than the layer's layout needs");
    return ints[i++];
  }
};

// A dense linear's kinds (a GGUF linear's kind is its number of runs, 1 or more).
constexpr int64_t kDense = -1;   // nn.Linear: F.linear
constexpr int64_t kPacked = -2;  // PackedLinear: oneDNN's packed GEMM

// PackedLinear.forward: oneDNN's packed GEMM over the rows padded to their bucket (row_bucket: every
// count to 16, then four a power of two), whose primitive the process has cached.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& weight, const Opt& bias) {
  static const c10::OperatorHandle gemm =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  const int64_t rows = x.size(0);
  int64_t bucket = rows;
  if (rows > 16) {
    int64_t power = 1;  // the power of two at or below rows
    while (power * 2 <= rows) power *= 2;
    const int64_t step = power / 4;
    bucket = (rows + step - 1) / step * step;
  }
  at::Tensor input = x;
  if (bucket != rows) {
    input = at::zeros({bucket, x.size(1)}, x.options());
    input.narrow(0, 0, rows).copy_(x);
  }
  std::vector<c10::IValue> stack{input, weight, bias, c10::IValue(std::string("none")),
                                 c10::IValue(c10::List<c10::optional<c10::Scalar>>()), c10::IValue()};
  gemm.callBoxed(&stack);
  const at::Tensor out = stack[0].toTensor();
  return bucket == rows ? out : out.narrow(0, 0, rows);
}

// One linear's bias and weight: a GGUF linear's runs are each quant_linear over its rows, the outputs
// joined (QuantLinear); a dense one is F.linear or PackedLinear's GEMM.
at::Tensor base_linear(Args& args, const at::Tensor& x, int64_t mode) {
  const Opt bias = args.tensor();
  const int64_t runs = args.integer();
  if (runs == kDense) return at::linear(x, args.required(), bias);
  if (runs == kPacked) return packed_linear(x, args.required(), bias);
  if (runs == 1) {
    const at::Tensor blocks = args.required();
    return quant_linear().call(x, blocks, args.integer(), bias, mode);
  }
  std::vector<at::Tensor> outs;
  int64_t row = 0;
  for (int64_t r = 0; r < runs; ++r) {
    const at::Tensor blocks = args.required();
    const int64_t type = args.integer(), rows = blocks.size(0);
    const Opt part = bias.has_value() ? Opt(bias->narrow(0, row, rows)) : c10::nullopt;
    outs.push_back(quant_linear().call(x, blocks, type, part, mode));
    row += rows;
  }
  return at::cat(outs, -1);
}

// The base linear, then its adapters' deltas for the rows that have one (LoRALinear.forward's kernel path).
at::Tensor linear(Args& args, const at::Tensor& x, int64_t mode, const Opt& lora_rows) {
  at::Tensor out = base_linear(args, x, mode);
  const int64_t parts = args.integer();
  if (parts == 0) return out;
  const at::Tensor a = args.required();
  std::vector<at::Tensor> b;
  for (int64_t p = 0; p < parts; ++p) b.push_back(args.required());
  if (lora_rows.has_value()) lora_delta().call(out, x, a, b, *lora_rows);
  return out;
}

std::tuple<at::Tensor, at::Tensor> decoder_layer(
    at::Tensor& x, const Opt& residual, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
    at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
    const at::Tensor& block_tables, const Opt& lora_rows, const c10::List<Opt>& tensors, c10::IntArrayRef ints,
    c10::ArrayRef<double> floats) {
  TORCH_CHECK(floats.size() == 5, "decoder_layer: floats are 5 (norm eps x3, scale, softcap), got ", floats.size());
  const Kernels& k = kernels();
  Args args{tensors, ints};
  const at::Tensor input_norm = args.required(), post_norm = args.required();
  const Opt q_norm = args.tensor(), k_norm = args.tensor(), router = args.tensor();
  const Opt out_norm = args.tensor(), mlp_out_norm = args.tensor();
  const int64_t heads = args.integer(), kv_heads = args.integer(), head_dim = args.integer();
  const int64_t window = args.integer(), mode = args.integer(), top_k = args.integer();
  const bool normalize = args.integer() != 0;
  const int64_t experts = args.integer();
  const bool gelu = args.integer() != 0;
  const int64_t tokens = x.size(0);

  at::Tensor h, res;
  if (residual.has_value()) {
    res = *residual;
    k.add_rms_norm.call(x, res, input_norm, floats[0]);
    h = x;
  } else {
    h = k.rms_norm.call(x, input_norm, floats[0]);
    res = x;
  }

  const at::Tensor qkv = linear(args, h, mode, lora_rows);
  const at::Tensor all_heads = qkv.view({tokens, -1, head_dim});
  at::Tensor q = all_heads.narrow(1, 0, heads), key = all_heads.narrow(1, heads, kv_heads);
  const at::Tensor value = all_heads.narrow(1, heads + kv_heads, kv_heads);
  // A partial rotary (Phi-4-mini's 0.75) turns only the first rotary_dim of each head, as attention.py.
  const int64_t rotary_dim = 2 * cos.size(-1);
  const auto turn = [&](const at::Tensor& heads_of) {
    at::Tensor part = rotary_dim == head_dim ? heads_of : heads_of.narrow(2, 0, rotary_dim);
    k.rotary_.call(part, cos, sin);
  };
  if (q_norm.has_value() && k_norm.has_value()) {
    q = k.rms_norm.call(q, *q_norm, floats[2]);
    key = k.rms_norm.call(key, *k_norm, floats[2]);
    turn(q);
    turn(key);
  } else {
    turn(all_heads.narrow(1, 0, heads + kv_heads));
  }
  k.write_kv.call(key, value, k_cache, v_cache, slot_mapping);
  if (q.stride(2) != 1 || q.stride(1) != q.size(2)) q = q.contiguous();  // as backend.py's run_paged_op
  at::Tensor attended = at::empty(q.sizes(), q.options());
  k.paged_attention.call(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, floats[3], window, floats[4],
                         attended);
  at::Tensor o = linear(args, attended.view({tokens, heads * head_dim}), mode, lora_rows);

  if (out_norm.has_value()) o = k.rms_norm.call(o, *out_norm, floats[1]);
  k.add_rms_norm.call(o, res, post_norm, floats[1]);
  if (top_k == 0) {
    const at::Tensor gate_up = linear(args, o, mode, lora_rows);
    at::Tensor hidden;
    if (gelu) {  // mlp.py's gelu_tanh_and_mul: the same ATen ops on the same halves
      const int64_t half = gate_up.size(-1) / 2;
      hidden = at::gelu(gate_up.narrow(-1, 0, half), "tanh") * gate_up.narrow(-1, half, half);
    } else {
      hidden = k.silu_and_mul.call(gate_up);
    }
    at::Tensor out = linear(args, hidden, mode, lora_rows);
    if (mlp_out_norm.has_value()) out = k.rms_norm.call(out, *mlp_out_norm, floats[1]);
    return {out, res};
  }
  TORCH_CHECK(router.has_value(), "decoder_layer: a MoE layer needs its router");
  auto [expert_ids, weights] = k.moe_route.call(o, *router, top_k, normalize);
  const at::Tensor gate_up = args.required(), down = args.required();
  const int64_t gate_up_type = args.integer(), down_type = args.integer();
  at::Tensor out = moe_experts().call(o, expert_ids, weights, gate_up, gate_up_type, down, down_type, experts, mode);
  if (mlp_out_norm.has_value()) out = k.rms_norm.call(out, *mlp_out_norm, floats[1]);
  return {out, res};
}

}  // namespace

PAGEDSERVE_TORCH_LIBRARY(m) {
  m.def(
      "decoder_layer(Tensor(a!) x, Tensor(b!)? residual, Tensor cos, Tensor sin, Tensor(c!) k_cache, "
      "Tensor(d!) v_cache, Tensor slot_mapping, Tensor query_start_loc, Tensor seq_lens, Tensor block_tables, "
      "Tensor? lora_rows, Tensor?[] tensors, int[] ints, float[] floats) -> (Tensor, Tensor)");
}

PAGEDSERVE_TORCH_LIBRARY_IMPL(CPU, m) { m.impl("decoder_layer", &decoder_layer); }
// A PackedLinear's weight is an MkldnnCPU tensor, and every tensor argument has its say in the key the
// dispatcher picks: the same kernel there.
PAGEDSERVE_TORCH_LIBRARY_IMPL(MkldnnCPU, m) { m.impl("decoder_layer", &decoder_layer); }
