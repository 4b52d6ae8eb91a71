// Recurrent-layer kernels (ONNX) on the CPU: RNN, GRU, LSTM, in f32 (f16 and
// bf16 converted around it by float_staging.h).
//
// The ONNX equations, every direction, layout and activation the spec
// allows: the gate pre-activations are W x + R h + Wb + Rb (LSTM adds the
// peepholes P * c), clipped to [-clip, clip] when clip is set, then the
// activations (defaults RNN: Tanh; GRU: Sigmoid, Tanh; LSTM: Sigmoid, Tanh,
// Tanh; a bidirectional layer may list one set for both directions). GRU
// honours linear_before_reset, LSTM input_forget (f = 1 - i). A batch element
// with sequence_lens[b] = L runs steps 0..L-1 (reverse: L-1..0); its Y rows
// from L on are 0 and its Y_h/Y_c are the state after its last step.
//
// How it is fast. Per direction, the input half of every gate for every time
// step is one GEMM before the recurrence starts ([seq * batch, input] x W^T,
// oneDNN's sgemm, biases folded in). What remains per step is the recurrent
// product h R^T, a few rows times a [hidden, gates * hidden] matrix: kiln's
// own vector kernel (vector_kernels.h, matmulAccumulate) over R transposed
// and cut into panels of columns (panel_matrix.h), which prepare makes once
// when R is a constant (else run packs it into scratch), then the
// activations as vector loops over whole gate rows. The two directions of a
// bidirectional layer run on two threads when the layer is big enough to
// pay for waking them (parallel.h); an LSTM or GRU whose R is too big for a
// core's cache instead splits its hidden units across the threads, one
// direction after the other (stepsAcrossThreads).
//
// com.microsoft.DynamicQuantizeLSTM (onnxruntime's dynamically quantized
// LSTM: int8 W [directions, input, 4 hidden] and R [directions, hidden, 4
// hidden] with scales and zero points per direction or per gate column) runs
// the same steps, its two products as onnxruntime computes them: the inputs
// (all steps at once) and each step's h quantized to u8 by
// DynamicQuantizeLinear's rule, the integer products exact
// (exact_int_gemm.h), each column scaled by the input's scale times the
// weight's. As onnxruntime's LSTM, it adds the biases after both products.
//
// Scratch (the projected inputs, the running h and c, the gates) lives in
// the state, one set per direction: one call at a time per prepared step, as
// the executor runs them.
#include <dnnl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/exact_int_gemm.h"
#include "kernels/cpu/float_staging.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/cpu/panel_matrix.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::present;
using checks::typeText;
using vec::Unary;

enum class Cell { kRnn, kGru, kLstm };

int64_t gatesOf(Cell cell) { return cell == Cell::kRnn ? 1 : (cell == Cell::kGru ? 3 : 4); }
int64_t activationsOf(Cell cell) { return cell == Cell::kRnn ? 1 : (cell == Cell::kGru ? 2 : 3); }

// ------------------------------------------------------------ activations

enum class ActivationKind {
  kRelu, kTanh, kSigmoid, kAffine, kLeakyRelu, kThresholdedRelu, kScaledTanh, kHardSigmoid, kElu, kSoftsign,
  kSoftplus
};

struct Activation {
  ActivationKind kind = ActivationKind::kTanh;
  float alpha = 0, beta = 0;
};

// The spec's names (compared without case, as onnxruntime does), whether
// each reads alpha and beta, and their defaults: those of the ONNX operators
// of the same name (Affine and ScaledTanh, which have none, the identity).
struct ActivationSpec {
  const char* name;
  ActivationKind kind;
  bool has_alpha, has_beta;
  float alpha, beta;
};
constexpr ActivationSpec kActivationSpecs[] = {
    {"relu", ActivationKind::kRelu, false, false, 0, 0},
    {"tanh", ActivationKind::kTanh, false, false, 0, 0},
    {"sigmoid", ActivationKind::kSigmoid, false, false, 0, 0},
    {"affine", ActivationKind::kAffine, true, true, 1.0f, 0.0f},
    {"leakyrelu", ActivationKind::kLeakyRelu, true, false, 0.01f, 0},
    {"thresholdedrelu", ActivationKind::kThresholdedRelu, true, false, 1.0f, 0},
    {"scaledtanh", ActivationKind::kScaledTanh, true, true, 1.0f, 1.0f},
    {"hardsigmoid", ActivationKind::kHardSigmoid, true, true, 0.2f, 0.5f},
    {"elu", ActivationKind::kElu, true, false, 1.0f, 0},
    {"softsign", ActivationKind::kSoftsign, false, false, 0, 0},
    {"softplus", ActivationKind::kSoftplus, false, false, 0, 0},
};

// The activations of every direction, in order (f, g[, h] per direction):
// the `activations` attribute with activation_alpha and activation_beta
// consumed in order by the functions that take them.
std::vector<Activation> parseActivations(std::string_view op, Cell cell, int64_t directions, const ParamMap& params) {
  const int64_t per_direction = activationsOf(cell);
  std::vector<std::string> names = params.getStrings("activations", {});
  if (names.empty()) {
    names = cell == Cell::kRnn   ? std::vector<std::string>{"Tanh"}
            : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                 : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  }
  if (static_cast<int64_t>(names.size()) == per_direction && directions == 2) {
    const std::vector<std::string> one_direction = names;  // one set for both directions
    names.insert(names.end(), one_direction.begin(), one_direction.end());
  }
  if (static_cast<int64_t>(names.size()) != per_direction * directions) {
    throw UsageError(fmt::format("{}: 'activations' lists {} functions; {} direction(s) need {}", op, names.size(),
                                 directions, per_direction * directions));
  }
  const std::vector<double> alphas = params.getFloats("activation_alpha", {});
  const std::vector<double> betas = params.getFloats("activation_beta", {});
  size_t next_alpha = 0, next_beta = 0;
  std::vector<Activation> activations;
  for (const std::string& name : names) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    const ActivationSpec* spec = nullptr;
    for (const ActivationSpec& candidate : kActivationSpecs) {
      if (lower == candidate.name) spec = &candidate;
    }
    if (spec == nullptr) {
      throw UsageError(fmt::format("{}: unknown activation '{}' (the spec allows Relu, Tanh, Sigmoid, Affine, "
                                   "LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)",
                                   op, name));
    }
    Activation a{spec->kind, spec->alpha, spec->beta};
    if (spec->has_alpha && next_alpha < alphas.size()) a.alpha = static_cast<float>(alphas[next_alpha++]);
    if (spec->has_beta && next_beta < betas.size()) a.beta = static_cast<float>(betas[next_beta++]);
    activations.push_back(a);
  }
  return activations;
}

// x[i] = f(x[i]) for i < n.
void activate(const Activation& a, float* x, int64_t n) {
  const vec::VectorKernels& v = vec::vectorKernels();
  switch (a.kind) {
    case ActivationKind::kRelu: v.unaryFn(Unary::kRelu)(x, x, n, 0, 0); return;
    case ActivationKind::kTanh: v.unaryFn(Unary::kTanh)(x, x, n, 0, 0); return;
    case ActivationKind::kSigmoid: v.unaryFn(Unary::kSigmoid)(x, x, n, 0, 0); return;
    case ActivationKind::kAffine: v.affine(x, x, n, a.alpha, a.beta); return;
    case ActivationKind::kLeakyRelu: v.unaryFn(Unary::kLeakyRelu)(x, x, n, a.alpha, 0); return;
    case ActivationKind::kThresholdedRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > a.alpha ? x[i] : 0.0f;
      return;
    case ActivationKind::kScaledTanh:
      v.affine(x, x, n, a.beta, 0.0f);
      v.unaryFn(Unary::kTanh)(x, x, n, 0, 0);
      v.affine(x, x, n, a.alpha, 0.0f);
      return;
    case ActivationKind::kHardSigmoid: v.unaryFn(Unary::kHardSigmoid)(x, x, n, a.alpha, a.beta); return;
    case ActivationKind::kElu: v.unaryFn(Unary::kElu)(x, x, n, a.alpha, 0); return;
    case ActivationKind::kSoftsign:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::fabs(x[i]));
      return;
    case ActivationKind::kSoftplus: v.unaryFn(Unary::kSoftplus)(x, x, n, 0, 0); return;
  }
}

// ------------------------------------------------------------------ state

// One direction's scratch, sized at prepare.
struct DirectionScratch {
  std::vector<float> projected;  // [seq * batch, gates * hidden]: W x + biases, rows as X's
  std::vector<float> r_t;        // R^T in panels (panel_matrix.h; when R is not a constant)
  std::vector<float> bias;       // [gates * hidden]: the biases added to W x
  std::vector<float> h, c;       // [batch, hidden]
  std::vector<float> h_next;     // [batch, hidden]: the next h, when the hidden units are split across threads
  std::vector<float> gates;      // [batch, gates * hidden]
  std::vector<float> extra;      // [batch, hidden]: GRU's r * h or R_h h; LSTM's tanh(c)
  // DynamicQuantizeLSTM: the quantized inputs (all steps), h, and the i32 products.
  std::vector<uint8_t> x_q, h_q;
  std::vector<int32_t> products;  // [max(seq * batch, batch), gates * hidden]
};

// DynamicQuantizeLSTM's weights of one direction.
struct QuantizedDirection {
  std::unique_ptr<ExactIntGemm> w, r;  // x_q W and h_q R, exact i32
  std::vector<float> w_scale, r_scale;  // per gate column
};

struct RecurrentState final : KernelState {
  Cell cell = Cell::kRnn;
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, directions = 1;
  bool reverse_only = false;  // direction "reverse"
  bool batch_major = false;   // layout 1
  float clip = 0;             // 0: none
  bool linear_before_reset = false;
  bool input_forget = false;
  bool has_bias = false, has_lens = false, has_h0 = false, has_c0 = false, has_peepholes = false;
  std::vector<Activation> activations;      // activationsOf(cell) per direction
  std::vector<std::vector<float>> r_packed;  // per direction, R^T in panels, when R is a constant
  std::vector<QuantizedDirection> quantized;  // DynamicQuantizeLSTM only, per direction
  fp::FloatStaging staging;
  mutable std::vector<DirectionScratch> scratch;  // per direction, see the header comment
};

// Input index of each optional input.
constexpr size_t kBias = 3, kLens = 4, kInitialH = 5, kInitialC = 6, kPeepholes = 7;

// Input indices of DynamicQuantizeLSTM's scales and zero points.
constexpr size_t kWScale = 8, kWZero = 9, kRScale = 10, kRZero = 11;

void prepareQuantizedWeights(std::string_view op, RecurrentState& s, const KernelSetup& setup);

std::unique_ptr<KernelState> prepareRecurrent(std::string_view op, Cell cell, const KernelSetup& setup,
                                              bool quantized = false) {
  if (quantized) {
    checks::expectCounts(op, setup, 3, 12, 0, 3);  // the scales and zero points: prepareQuantizedWeights
  } else {
    checks::expectCounts(op, setup, 3, cell == Cell::kLstm ? 8 : 6, 0, cell == Cell::kLstm ? 3 : 2);
  }
  const TensorInfo& x = setup.inputs[0];
  if (quantized && x.dtype != DType::kF32) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32)", op, typeText(x)));
  }
  if (!fp::isComputedInF32(x.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32, f16, bf16)", op, typeText(x)));
  }
  auto s = std::make_unique<RecurrentState>();
  s->cell = cell;
  s->hidden = setup.params.getInt("hidden_size", 0);
  if (s->hidden < 1) throw UsageError(fmt::format("{}: needs a positive hidden_size, found {}", op, s->hidden));
  const std::string direction = setup.params.getString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    throw UsageError(fmt::format("{}: direction is '{}', not forward, reverse or bidirectional", op, direction));
  }
  s->directions = direction == "bidirectional" ? 2 : 1;
  s->reverse_only = direction == "reverse";
  s->activations = parseActivations(op, cell, s->directions, setup.params);
  const int64_t layout = setup.params.getInt("layout", 0);
  if (layout != 0 && layout != 1) throw UsageError(fmt::format("{}: layout is {}, not 0 or 1", op, layout));
  s->batch_major = layout == 1;
  if (x.shape.size() != 3) throw UsageError(fmt::format("{}: X must be 3-D, found {}", op, typeText(x)));
  s->seq = x.shape[s->batch_major ? 1 : 0];
  s->batch = x.shape[s->batch_major ? 0 : 1];
  s->input = x.shape[2];
  s->clip = static_cast<float>(setup.params.getFloat("clip", 0.0));
  if (s->clip < 0) throw UsageError(fmt::format("{}: clip {} is negative", op, s->clip));
  s->linear_before_reset = setup.params.getInt("linear_before_reset", 0) != 0;
  s->input_forget = setup.params.getInt("input_forget", 0) != 0;

  const int64_t d = s->directions, h = s->hidden, g = gatesOf(cell) * s->hidden;
  const Ints state = s->batch_major ? Ints{s->batch, d, h} : Ints{d, s->batch, h};
  auto expectInput = [&](size_t index, const char* name, const Ints& shape, DType dtype) {
    if (!present(setup.inputs, index)) return false;
    if (setup.inputs[index] != TensorInfo{dtype, shape}) {
      throw UsageError(fmt::format("{}: {} (input {}) must be {}, found {}", op, name, index,
                                   typeText(TensorInfo{dtype, shape}), typeText(setup.inputs[index])));
    }
    return true;
  };
  if (quantized) {
    const DType weights = setup.inputs[1].dtype;
    if (weights != DType::kI8 && weights != DType::kU8) {
      throw UsageError(fmt::format("{}: W must be i8 or u8, found {}", op, typeText(setup.inputs[1])));
    }
    expectInput(1, "W", {d, s->input, g}, weights);
    expectInput(2, "R", {d, h, g}, weights);
  } else {
    expectInput(1, "W", {d, g, s->input}, x.dtype);
    expectInput(2, "R", {d, g, h}, x.dtype);
  }
  s->has_bias = expectInput(kBias, "B", {d, 2 * g}, x.dtype);
  s->has_lens = expectInput(kLens, "sequence_lens", {s->batch}, DType::kI32);
  s->has_h0 = expectInput(kInitialH, "initial_h", state, x.dtype);
  s->has_c0 = expectInput(kInitialC, "initial_c", state, x.dtype);
  s->has_peepholes = expectInput(kPeepholes, "P", {d, 3 * h}, x.dtype);

  const Ints y = s->batch_major ? Ints{s->batch, s->seq, d, h} : Ints{s->seq, d, s->batch, h};
  for (size_t i = 0; i < setup.outputs.size(); ++i) checks::expectOutput(op, setup, i, x.dtype, i == 0 ? y : state);

  // A constant f32 R is transposed once, here.
  const bool r_constant = quantized || (setup.constants.size() > 2 && setup.constants[2] != nullptr &&
                                        x.dtype == DType::kF32);
  if (quantized) prepareQuantizedWeights(op, *s, setup);
  if (r_constant && !quantized) {
    const auto* r = reinterpret_cast<const float*>(setup.constants[2]);
    for (int64_t dir = 0; dir < d; ++dir) {
      s->r_packed.emplace_back(panelsSize(h, g));
      packPanels(r + dir * g * h, h, g, 1, h, s->r_packed.back().data());
    }
  }
  const auto size = [](int64_t n) { return static_cast<size_t>(n); };
  s->scratch.resize(size(d));
  for (DirectionScratch& scratch : s->scratch) {
    scratch.projected.assign(size(s->seq * s->batch * g), 0.0f);
    if (!r_constant) scratch.r_t.assign(panelsSize(h, g), 0.0f);
    scratch.bias.assign(size(g), 0.0f);
    scratch.h.assign(size(s->batch * h), 0.0f);
    scratch.h_next.assign(size(s->batch * h), 0.0f);
    scratch.c.assign(size(s->batch * h), 0.0f);
    scratch.gates.assign(size(s->batch * g), 0.0f);
    scratch.extra.assign(size(s->batch * h), 0.0f);
    if (quantized) {
      scratch.x_q.assign(size(s->seq * s->batch * s->input), 0);
      scratch.h_q.assign(size(s->batch * h), 0);
      scratch.products.assign(size(std::max<int64_t>(s->seq, 1) * s->batch * g), 0);
    }
  }
  s->staging.plan(setup);
  return s;
}

std::unique_ptr<KernelState> prepareRnn(const KernelSetup& setup) { return prepareRecurrent("RNN", Cell::kRnn, setup); }
std::unique_ptr<KernelState> prepareGru(const KernelSetup& setup) { return prepareRecurrent("GRU", Cell::kGru, setup); }
std::unique_ptr<KernelState> prepareLstm(const KernelSetup& setup) { return prepareRecurrent("LSTM", Cell::kLstm, setup); }
std::unique_ptr<KernelState> prepareDynamicQuantizeLstm(const KernelSetup& setup) {
  return prepareRecurrent("DynamicQuantizeLSTM", Cell::kLstm, setup, /*quantized=*/true);
}

// W and R of every direction, with their scales and zero points (constants:
// one per direction, or one per gate column).
void prepareQuantizedWeights(std::string_view op, RecurrentState& s, const KernelSetup& setup) {
  const int64_t d_count = s.directions, g = 4 * s.hidden;
  const DType weights = setup.inputs[1].dtype;
  for (size_t i : {size_t{1}, size_t{2}, kWScale, kWZero, kRScale, kRZero}) {
    if (i >= setup.constants.size() || setup.constants[i] == nullptr) {
      throw UsageError(fmt::format("{}: W, R and their scales and zero points must be constants (input {} is not)", op, i));
    }
  }
  // Per direction ([d]) or per gate column ([d, 4 hidden]); the stride of one direction.
  auto perColumn = [&](size_t index, DType dtype, const char* name) {
    const TensorInfo& info = setup.inputs[index];
    if (info == TensorInfo{dtype, {d_count}}) return false;
    if (info == TensorInfo{dtype, {d_count, g}}) return true;
    throw UsageError(fmt::format("{}: {} (input {}) must be {}[{}] or {}[{}, {}], found {}", op, name, index,
                                 dtypeName(dtype), d_count, dtypeName(dtype), d_count, g, typeText(info)));
  };
  const bool w_columns = perColumn(kWScale, DType::kF32, "W_scale");
  const bool r_columns = perColumn(kRScale, DType::kF32, "R_scale");
  if (perColumn(kWZero, weights, "W_zero_point") != w_columns || perColumn(kRZero, weights, "R_zero_point") != r_columns) {
    throw UsageError(fmt::format("{}: each zero point must have the shape of its scale", op));
  }
  const size_t element = dtypeSize(weights);
  for (int64_t d = 0; d < d_count; ++d) {
    QuantizedDirection q;
    auto make = [&](size_t matrix, size_t scale, size_t zero, bool columns, int64_t rows, int64_t k,
                    std::vector<float>& column_scale) {
      const auto* scales = reinterpret_cast<const float*>(setup.constants[scale]);
      for (int64_t j = 0; j < g; ++j) column_scale.push_back(columns ? scales[d * g + j] : scales[d]);
      const std::byte* zero_point = setup.constants[zero] + (columns ? d * g : d) * static_cast<int64_t>(element);
      return prepareExactIntGemm(DType::kU8, rows, g, k, {0}, {0}, weights, setup.constants[matrix] + d * k * g * static_cast<int64_t>(element),
                                 static_cast<uint64_t>(k * g), zero_point, columns ? 1 : 0);
    };
    q.w = make(1, kWScale, kWZero, w_columns, s.seq * s.batch, s.input, q.w_scale);
    q.r = make(2, kRScale, kRZero, r_columns, s.batch, s.hidden, q.r_scale);
    s.quantized.push_back(std::move(q));
  }
}

// -------------------------------------------------------------------- run

// The f32 data of one call.
struct Operands {
  const float *x, *w, *r, *bias, *h0, *c0, *peep;
  const int32_t* lens;
  float *y, *y_h, *y_c;
};

void clipRow(const RecurrentState& s, float* v, int64_t n) {
  if (s.clip > 0) vec::vectorKernels().unaryFn(Unary::kClip)(v, v, n, -s.clip, s.clip);
}

// The gate math of one batch row after the recurrent product, for hidden
// units [begin, end): gates holds the pre-activations (for GRU, z and r
// only: see runDirection), c the state, updated in place; h gets the new h.
void lstmRow(const RecurrentState& s, const Activation* act, const float* peep, float* gates, float* h, float* c,
             float* tanh_c, int64_t begin, int64_t end) {
  const int64_t stride = s.hidden;  // between the gates of one unit
  const int64_t n = end - begin;
  float* i_gate = gates + begin;
  float* o_gate = i_gate + stride;
  float* f_gate = i_gate + 2 * stride;
  float* candidate = i_gate + 3 * stride;
  h += begin;
  c += begin;
  tanh_c += begin;
  if (peep != nullptr) {
    peep += begin;
    for (int64_t j = 0; j < n; ++j) {
      i_gate[j] += peep[j] * c[j];
      f_gate[j] += peep[2 * stride + j] * c[j];
    }
  }
  clipRow(s, i_gate, n);
  activate(act[0], i_gate, n);
  if (s.input_forget) {
    for (int64_t j = 0; j < n; ++j) f_gate[j] = 1.0f - i_gate[j];
  } else {
    clipRow(s, f_gate, n);
    activate(act[0], f_gate, n);
  }
  clipRow(s, candidate, n);
  activate(act[1], candidate, n);
  for (int64_t j = 0; j < n; ++j) c[j] = f_gate[j] * c[j] + i_gate[j] * candidate[j];
  if (peep != nullptr) {
    for (int64_t j = 0; j < n; ++j) o_gate[j] += peep[stride + j] * c[j];
  }
  clipRow(s, o_gate, n);
  activate(act[0], o_gate, n);
  std::copy(c, c + n, tanh_c);
  activate(act[2], tanh_c, n);
  for (int64_t j = 0; j < n; ++j) h[j] = o_gate[j] * tanh_c[j];
}

// to[row][j] (+)= (x quantized) W_q [row][j] * x_scale * w_scale[j], for
// `rows` rows of k floats: DynamicQuantizeLSTM's products, as onnxruntime
// computes them (the multiplier rounded to f32 first).
void projectQuantized(const ExactIntGemm& gemm, const std::vector<float>& column_scale, const float* x, int64_t rows,
                      int64_t k, int64_t g, uint8_t* x_q, int32_t* products, float* to, bool accumulate) {
  const DynamicQuantization q = quantizeDynamic(x, rows * k, x_q);
  // The scratch is this direction's, one call at a time (see the top): the
  // product cannot find it taken.
  runExactIntGemm(gemm, DType::kU8, reinterpret_cast<const std::byte*>(x_q), q.zero, products);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t j = 0; j < g; ++j) {
      const float value = static_cast<float>(products[row * g + j]) * (q.scale * column_scale[static_cast<size_t>(j)]);
      to[row * g + j] = accumulate ? to[row * g + j] + value : value;
    }
  }
}

// The steps of one LSTM or GRU direction with its hidden units split across
// the OpenMP pool (see runRecurrent): thread t owns units [begin, end) and
// every gate's column of each, and so reads the same columns of R^T at
// every step, which stay in its core's cache (on Sapphire Rapids, hidden
// 512: 2 MiB of an LSTM direction's 4 MiB per core, where a direction per
// thread streamed all 4 MiB from L3 at every step). h is double-buffered:
// every thread reads all of it, so one barrier per step; GRU without
// linear_before_reset has a second one, as (r * h) R_h^T reads all of r * h.
void stepsAcrossThreads(const RecurrentState& s, const Operands& in, const Activation* act, const float* peep,
                        const float* rb, const float* projected, const float* r_t, DirectionScratch& sc,
                        const auto& length, const auto& x_row, const auto& time_of, const auto& y_row) {
#if defined(_OPENMP)
  const vec::VectorKernels& v = vec::vectorKernels();
  const bool lstm = s.cell == Cell::kLstm;
  const bool lbr = !lstm && s.linear_before_reset;
  const int64_t n = s.hidden, gate_count = gatesOf(s.cell), g = gate_count * n;
  float* const buffers[2] = {sc.h.data(), sc.h_next.data()};
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    // Bounds on multiples of 16 units: whole vectors and cache lines.
    const auto bound = [&](int64_t t) { return t >= threads ? n : std::min(n, n * t / threads / 16 * 16); };
    const int64_t begin = bound(thread), end = bound(thread + 1), width = end - begin;
    // h R^T into this thread's columns of gates [first, last) (GRU's
    // candidate: of `extra`), the gates in turns forward and backward: a
    // core's columns are about as big as its L2, and walked in one order
    // each step would evict every line just before it is read again;
    // reversed, a step starts on what the last one read last.
    const auto products = [&](const float* a, int64_t first, int64_t last, float* to, int64_t ldc, bool backward) {
      for (int64_t q = 0; q < last - first; ++q) {
        const int64_t k = backward ? last - 1 - q : first + q;
        panelProduct(v, a, n, r_t, n, k * n + begin, k * n + end, to + (k - first) * n + begin, ldc, s.batch, backward);
      }
    };
    for (int64_t i = 0; i < s.seq && width > 0; ++i) {
      const float* h = buffers[i % 2];
      float* h_new = buffers[(i + 1) % 2];
      const bool backward = i % 2 == 1;
      for (int64_t b = 0; b < s.batch; ++b) {
        if (i >= length(b)) continue;
        const float* from = projected + x_row(b, time_of(b, i)) * g;
        float* gates = sc.gates.data() + b * g;
        for (int64_t k = 0; k < gate_count; ++k) std::copy(from + k * n + begin, from + k * n + end, gates + k * n + begin);
        if (lbr) {  // R_bh, or 0 without biases
          float* e = sc.extra.data() + b * n;
          if (rb == nullptr) {
            std::fill(e + begin, e + end, 0.0f);
          } else {
            std::copy(rb + 2 * n + begin, rb + 2 * n + end, e + begin);
          }
        }
      }
      // LSTM: all four gates. GRU: z and r; with linear_before_reset also
      // R_h h + R_bh into extra.
      products(h, 0, lstm ? 4 : 2, sc.gates.data(), g, backward);
      if (lbr) products(h, 2, 3, sc.extra.data(), n, backward);
      if (!lstm) {
        for (int64_t b = 0; b < s.batch; ++b) {
          if (i >= length(b)) continue;
          float* z = sc.gates.data() + b * g + begin;
          float* r = z + n;
          float* candidate = z + 2 * n;
          float* e = sc.extra.data() + b * n + begin;
          for (float* gate : {z, r}) {
            clipRow(s, gate, width);
            activate(act[0], gate, width);
          }
          if (lbr) {
            for (int64_t j = 0; j < width; ++j) candidate[j] += r[j] * e[j];
          } else {
            for (int64_t j = 0; j < width; ++j) e[j] = r[j] * h[b * n + begin + j];
          }
        }
        if (!lbr) {
#pragma omp barrier
          products(sc.extra.data(), 2, 3, sc.gates.data() + 2 * n, g, backward);
        }
      }
      for (int64_t b = 0; b < s.batch; ++b) {
        float* gates = sc.gates.data() + b * g;
        const bool active = i < length(b);
        if (!active) {
          std::copy(h + b * n + begin, h + b * n + end, h_new + b * n + begin);
        } else if (lstm) {
          for (int64_t k = 0; k < 4; ++k) {
            float* part = gates + k * n + begin;
            v.binaryFn(vec::Binary::kAdd, vec::Operands::kBoth)(part, sc.bias.data() + k * n + begin, part, width);
          }
          lstmRow(s, act, peep, gates, h_new + b * n, sc.c.data() + b * n, sc.extra.data() + b * n, begin, end);
        } else {
          const float* z = gates + begin;
          float* candidate = gates + 2 * n + begin;
          clipRow(s, candidate, width);
          activate(act[1], candidate, width);
          const float* h_old = h + b * n + begin;
          float* out = h_new + b * n + begin;
          for (int64_t j = 0; j < width; ++j) out[j] = (1.0f - z[j]) * candidate[j] + z[j] * h_old[j];
        }
        if (in.y != nullptr) {
          float* to = in.y + y_row(b, active ? time_of(b, i) : i) * n;  // the rows past the length are zeroed
          if (active) {
            std::copy(h_new + b * n + begin, h_new + b * n + end, to + begin);
          } else {
            std::fill(to + begin, to + end, 0.0f);
          }
        }
      }
#pragma omp barrier
    }
  }
  if (s.seq % 2 == 1) std::copy(sc.h_next.begin(), sc.h_next.end(), sc.h.begin());
#else
  (void)s, (void)in, (void)act, (void)peep, (void)rb, (void)projected, (void)r_t, (void)sc, (void)length,
      (void)x_row, (void)time_of, (void)y_row;
#endif
}

// One direction over the whole sequence.
void runDirection(const RecurrentState& s, const Operands& in, int64_t d, bool split_hidden) {
  DirectionScratch& sc = s.scratch[static_cast<size_t>(d)];
  const vec::VectorKernels& v = vec::vectorKernels();
  const int64_t n = s.hidden, g = gatesOf(s.cell) * n, d_count = s.directions, rows = s.seq * s.batch;
  const Activation* act = s.activations.data() + d * activationsOf(s.cell);
  const bool gru = s.cell == Cell::kGru;
  const bool lbr = gru && s.linear_before_reset;
  const bool lstm = s.cell == Cell::kLstm;
  const QuantizedDirection* quantized = s.quantized.empty() ? nullptr : &s.quantized[static_cast<size_t>(d)];
  const float* wb = in.bias == nullptr ? nullptr : in.bias + d * 2 * g;
  const float* rb = wb == nullptr ? nullptr : wb + g;
  const float* peep = in.peep == nullptr ? nullptr : in.peep + d * 3 * n;

  // The biases that add to W x: all of them, except GRU's R_h bias with
  // linear_before_reset (it is multiplied by r, below).
  const int64_t folded_rb = lbr ? 2 * n : g;
  for (int64_t j = 0; j < g; ++j) {
    sc.bias[j] = wb == nullptr ? 0.0f : wb[j] + (j < folded_rb ? rb[j] : 0.0f);
  }
  // projected = X W^T (+ the biases, but for LSTM, which adds them after
  // both products as onnxruntime does), every time step at once.
  float* projected = sc.projected.data();
  if (quantized != nullptr) {
    projectQuantized(*quantized->w, quantized->w_scale, in.x, rows, s.input, g, sc.x_q.data(), sc.products.data(),
                     projected, false);
  } else {
    for (int64_t row = 0; row < rows; ++row) {
      if (lstm) {
        std::fill(projected + row * g, projected + (row + 1) * g, 0.0f);
      } else {
        std::copy(sc.bias.begin(), sc.bias.end(), projected + row * g);
      }
    }
    if (rows > 0 && s.input > 0) {
      dnnl_sgemm('N', 'T', rows, g, s.input, 1.0f, in.x, s.input, in.w + d * g * s.input, s.input, 1.0f, projected, g);
    }
  }
  const float* r_t = sc.r_t.data();
  if (quantized != nullptr) {
    r_t = nullptr;  // the recurrent product is quantized->r's
  } else if (s.r_packed.empty()) {
    packPanels(in.r + d * g * n, n, g, 1, n, sc.r_t.data());
  } else {
    r_t = s.r_packed[static_cast<size_t>(d)].data();
  }

  // Initial state: [directions, batch, hidden], or [batch, directions, hidden] batch-major.
  const auto state_at = [&](int64_t b) { return (s.batch_major ? b * d_count + d : d * s.batch + b) * n; };
  for (int64_t b = 0; b < s.batch; ++b) {
    float* h = sc.h.data() + b * n;
    float* c = sc.c.data() + b * n;
    if (in.h0 != nullptr) {
      std::copy(in.h0 + state_at(b), in.h0 + state_at(b) + n, h);
    } else {
      std::fill(h, h + n, 0.0f);
    }
    if (in.c0 != nullptr) {
      std::copy(in.c0 + state_at(b), in.c0 + state_at(b) + n, c);
    } else {
      std::fill(c, c + n, 0.0f);
    }
  }
  const bool reverse = s.reverse_only || d == 1;
  const auto length = [&](int64_t b) { return in.lens == nullptr ? s.seq : std::clamp<int64_t>(in.lens[b], 0, s.seq); };
  const auto x_row = [&](int64_t b, int64_t t) { return s.batch_major ? b * s.seq + t : t * s.batch + b; };
  const auto time_of = [&](int64_t b, int64_t i) { return reverse ? length(b) - 1 - i : i; };

  // Y's row of batch element b at time t.
  const auto y_row = [&](int64_t b, int64_t t) {
    return s.batch_major ? (b * s.seq + t) * d_count + d : (t * d_count + d) * s.batch + b;
  };
  if (split_hidden) {
    stepsAcrossThreads(s, in, act, peep, rb, projected, r_t, sc, length, x_row, time_of, y_row);
  } else {
    float* gates = sc.gates.data();
    float* extra = sc.extra.data();
    for (int64_t i = 0; i < s.seq; ++i) {
      // gates = projected inputs + h R^T (GRU: z and r only; with
      // linear_before_reset, R_h h + R_bh goes to `extra`).
      for (int64_t b = 0; b < s.batch; ++b) {
        if (i < length(b)) {
          const float* from = projected + x_row(b, time_of(b, i)) * g;
          std::copy(from, from + g, gates + b * g);
        }
      }
      const int64_t first_columns = gru ? 2 * n : g;
      if (quantized != nullptr) {
        projectQuantized(*quantized->r, quantized->r_scale, sc.h.data(), s.batch, n, g, sc.h_q.data(), sc.products.data(),
                         gates, true);
      } else {
        panelProduct(v, sc.h.data(), n, r_t, n, 0, first_columns, gates, g, s.batch, i % 2 == 1);
      }
      if (lstm) {
        for (int64_t b = 0; b < s.batch; ++b) v.binaryFn(vec::Binary::kAdd, vec::Operands::kBoth)(gates + b * g, sc.bias.data(), gates + b * g, g);
      }
      if (lbr) {
        for (int64_t b = 0; b < s.batch; ++b) {
          for (int64_t j = 0; j < n; ++j) extra[b * n + j] = rb == nullptr ? 0.0f : rb[2 * n + j];
        }
        panelProduct(v, sc.h.data(), n, r_t, n, 2 * n, 3 * n, extra, n, s.batch);
      }
      if (gru) {
        // z and r; then the candidate's pre-activation.
        for (int64_t b = 0; b < s.batch; ++b) {
          if (i >= length(b)) continue;
          float* zr = gates + b * g;
          clipRow(s, zr, 2 * n);
          activate(act[0], zr, 2 * n);
          const float* r = zr + n;
          float* candidate = zr + 2 * n;
          const float* h = sc.h.data() + b * n;
          float* e = extra + b * n;
          if (lbr) {
            for (int64_t j = 0; j < n; ++j) candidate[j] += r[j] * e[j];
          } else {
            for (int64_t j = 0; j < n; ++j) e[j] = r[j] * h[j];
          }
        }
        if (!lbr) panelProduct(v, extra, n, r_t, n, 2 * n, 3 * n, gates + 2 * n, g, s.batch);
      }
      for (int64_t b = 0; b < s.batch; ++b) {
        if (i >= length(b)) continue;
        float* row = gates + b * g;
        float* h = sc.h.data() + b * n;
        switch (s.cell) {
          case Cell::kRnn:
            clipRow(s, row, n);
            activate(act[0], row, n);
            std::copy(row, row + n, h);
            break;
          case Cell::kGru: {
            const float* z = row;
            float* candidate = row + 2 * n;
            clipRow(s, candidate, n);
            activate(act[1], candidate, n);
            for (int64_t j = 0; j < n; ++j) h[j] = (1.0f - z[j]) * candidate[j] + z[j] * h[j];
            break;
          }
          case Cell::kLstm: lstmRow(s, act, peep, row, h, sc.c.data() + b * n, extra + b * n, 0, n); break;
        }
      }
      if (in.y != nullptr) {
        for (int64_t b = 0; b < s.batch; ++b) {
          const bool active = i < length(b);
          const int64_t t = active ? time_of(b, i) : i;  // the rows past the length are zeroed
          float* to = in.y + y_row(b, t) * n;
          if (active) {
            std::copy(sc.h.data() + b * n, sc.h.data() + (b + 1) * n, to);
          } else {
            std::fill(to, to + n, 0.0f);
          }
        }
      }
    }
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    if (in.y_h != nullptr) std::copy(sc.h.data() + b * n, sc.h.data() + (b + 1) * n, in.y_h + state_at(b));
    if (in.y_c != nullptr) std::copy(sc.c.data() + b * n, sc.c.data() + (b + 1) * n, in.y_c + state_at(b));
  }
}

// Whether an LSTM's or GRU's steps split the hidden units across threads
// (stepsAcrossThreads) rather than giving each direction a thread: when one
// direction's R is 1 MiB or more (LSTM from hidden 256, GRU from 296), too
// big for a core's cache next to the other direction's. On a Sapphire
// Rapids VM, 2 threads, one bidirectional layer of hidden 512 over 32 steps
// (ddddocr's LSTM), p50 with onnxruntime alternated: LSTM 6.6-7.0 ->
// 4.1-5.1 ms (onnxruntime 3.6-5.3 in the same minutes), GRU 4.7-5.1 (against
// 3.2-3.6) -> 2.7-3.4 ms (against 2.3-3.3). Both still trail onnxruntime
// (bench/recurrent_layer.py: 0.83x-0.92x its speed).
bool splitsHidden(const RecurrentState& s) {
#if defined(_OPENMP)
  constexpr int64_t kMinRBytes = int64_t{1} << 20;
  return s.cell != Cell::kRnn && s.quantized.empty() && gatesOf(s.cell) * s.hidden * s.hidden * 4 >= kMinRBytes &&
         omp_get_max_threads() > 1 && !omp_in_parallel();
#else
  (void)s;
  return false;
#endif
}

void runRecurrent(const KernelCall& call) {
  const auto& s = static_cast<const RecurrentState&>(*call.state);
  Operands in{};
  in.x = s.staging.input(call, 0);
  in.w = s.staging.input(call, 1);
  in.r = s.staging.input(call, 2);
  in.bias = s.has_bias ? s.staging.input(call, kBias) : nullptr;
  in.lens = s.has_lens ? call.inputs[kLens].as<const int32_t>() : nullptr;
  in.h0 = s.has_h0 ? s.staging.input(call, kInitialH) : nullptr;
  in.c0 = s.has_c0 ? s.staging.input(call, kInitialC) : nullptr;
  in.peep = s.has_peepholes ? s.staging.input(call, kPeepholes) : nullptr;
  in.y = call.output_count > 0 ? s.staging.output(call, 0) : nullptr;
  in.y_h = call.output_count > 1 ? s.staging.output(call, 1) : nullptr;
  in.y_c = call.output_count > 2 ? s.staging.output(call, 2) : nullptr;
  // Work of one direction, in multiply-adds: what decides whether the two
  // directions are worth two threads.
  const int64_t g = gatesOf(s.cell) * s.hidden;
  if (splitsHidden(s)) {
    for (int64_t d = 0; d < s.directions; ++d) runDirection(s, in, d, /*split_hidden=*/true);
  } else {
    const int64_t direction_work = s.seq * s.batch * g * (s.input + s.hidden);
    parallelForItems(s.directions, direction_work, [&](int64_t begin, int64_t end) {
      for (int64_t d = begin; d < end; ++d) runDirection(s, in, d, /*split_hidden=*/false);
    });
  }
  s.staging.finish(call);
}

}  // namespace

void registerRecurrentKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"RNN", &prepareRnn, &runRecurrent});
  registry.add(KernelDef{"GRU", &prepareGru, &runRecurrent});
  registry.add(KernelDef{"LSTM", &prepareLstm, &runRecurrent});
  registry.add(KernelDef{"com.microsoft.DynamicQuantizeLSTM", &prepareDynamicQuantizeLstm, &runRecurrent});
}

}  // namespace kiln
