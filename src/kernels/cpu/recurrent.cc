// Recurrent-layer kernels (ONNX) on the CPU: RNN, GRU, LSTM, in f32 (f16 and
// bf16 converted around it by float_staging.h).
//
// Every direction, batch element and time step runs the ONNX equations with
// the default activations (RNN: tanh; GRU and LSTM: sigmoid for the gates,
// tanh for the cell): the gate pre-activations are W x + R h + Wb + Rb (LSTM
// adds the peepholes P * c), clipped to [-clip, clip] when clip is set. GRU
// honours linear_before_reset, LSTM input_forget (f = 1 - i). A batch
// element with sequence_lens[b] = L runs steps 0..L-1 (reverse: L-1..0);
// its Y rows from L on are 0 and its Y_h/Y_c are the state after its last
// step. The matrix-vector products are plain loops: recurrent layers in
// ONNX models are small, and each step depends on the last.
//
// Other activations (the `activations` attribute) are not supported: the
// compiler cannot pass a list of strings to a kernel, so such a model fails
// at compile time with a message naming the attribute.
//
// Scratch (the running h and c, the gates) lives in the state: one call at a
// time per prepared step, as the executor runs them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/float_staging.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::present;
using checks::typeText;

enum class Cell { kRnn, kGru, kLstm };

int64_t gatesOf(Cell cell) { return cell == Cell::kRnn ? 1 : (cell == Cell::kGru ? 3 : 4); }

struct RecurrentState final : KernelState {
  Cell cell = Cell::kRnn;
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, directions = 1;
  bool reverse_only = false;  // direction "reverse"
  bool batch_major = false;   // layout 1
  float clip = 0;             // 0: none
  bool linear_before_reset = false;
  bool input_forget = false;
  bool has_bias = false, has_lens = false, has_h0 = false, has_c0 = false, has_peepholes = false;
  fp::FloatStaging staging;
  mutable std::vector<float> h, c, gates, reset_h;  // scratch, see the header comment
};

// Input index of each optional input.
constexpr size_t kBias = 3, kLens = 4, kInitialH = 5, kInitialC = 6, kPeepholes = 7;

std::unique_ptr<KernelState> prepareRecurrent(std::string_view op, Cell cell, const KernelSetup& setup) {
  checks::expectCounts(op, setup, 3, cell == Cell::kLstm ? 8 : 6, 0, cell == Cell::kLstm ? 3 : 2);
  const TensorInfo& x = setup.inputs[0];
  if (!fp::isComputedInF32(x.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs (supports f32, f16, bf16)", op, typeText(x)));
  }
  if (setup.params.has("activations")) {
    throw UsageError(fmt::format("{}: only the default activations are supported", op));
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
  expectInput(1, "W", {d, g, s->input}, x.dtype);
  expectInput(2, "R", {d, g, h}, x.dtype);
  s->has_bias = expectInput(kBias, "B", {d, 2 * g}, x.dtype);
  s->has_lens = expectInput(kLens, "sequence_lens", {s->batch}, DType::kI32);
  s->has_h0 = expectInput(kInitialH, "initial_h", state, x.dtype);
  s->has_c0 = expectInput(kInitialC, "initial_c", state, x.dtype);
  s->has_peepholes = expectInput(kPeepholes, "P", {d, 3 * h}, x.dtype);

  const Ints y = s->batch_major ? Ints{s->batch, s->seq, d, h} : Ints{s->seq, d, s->batch, h};
  for (size_t i = 0; i < setup.outputs.size(); ++i) checks::expectOutput(op, setup, i, x.dtype, i == 0 ? y : state);
  s->h.resize(static_cast<size_t>(h));
  s->c.resize(static_cast<size_t>(h));
  s->gates.resize(static_cast<size_t>(g));
  s->reset_h.resize(static_cast<size_t>(h));
  s->staging.plan(setup);
  return s;
}

std::unique_ptr<KernelState> prepareRnn(const KernelSetup& setup) { return prepareRecurrent("RNN", Cell::kRnn, setup); }
std::unique_ptr<KernelState> prepareGru(const KernelSetup& setup) { return prepareRecurrent("GRU", Cell::kGru, setup); }
std::unique_ptr<KernelState> prepareLstm(const KernelSetup& setup) { return prepareRecurrent("LSTM", Cell::kLstm, setup); }

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// One direction's weights.
struct Weights {
  const float* w;     // [gates * hidden, input]
  const float* r;     // [gates * hidden, hidden]
  const float* wb;    // [gates * hidden] or nullptr
  const float* rb;    // [gates * hidden] or nullptr
  const float* peep;  // [3 * hidden] (i, o, f) or nullptr
};

// The clipped pre-activation of gate row `row`: W x + R h (h may be the
// reset h of GRU) + the biases.
float preActivation(const RecurrentState& s, const Weights& wt, int64_t row, const float* x, const float* h,
                    bool recurrent_bias = true) {
  float v = dot(wt.w + row * s.input, x, s.input) + dot(wt.r + row * s.hidden, h, s.hidden);
  if (wt.wb != nullptr) v += wt.wb[row] + (recurrent_bias ? wt.rb[row] : 0.0f);
  return v;
}

float clipped(const RecurrentState& s, float v) { return s.clip > 0 ? std::clamp(v, -s.clip, s.clip) : v; }

// One time step of one batch element: updates s.h (and s.c).
void step(const RecurrentState& s, const Weights& wt, const float* x) {
  const int64_t n = s.hidden;
  float* h = s.h.data();
  float* c = s.c.data();
  float* gates = s.gates.data();
  switch (s.cell) {
    case Cell::kRnn:
      for (int64_t j = 0; j < n; ++j) gates[j] = std::tanh(clipped(s, preActivation(s, wt, j, x, h)));
      std::copy(gates, gates + n, h);
      return;
    case Cell::kGru: {
      float* z = gates;
      float* r = gates + n;
      float* candidate = gates + 2 * n;
      for (int64_t j = 0; j < 2 * n; ++j) gates[j] = sigmoid(clipped(s, preActivation(s, wt, j, x, h)));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = 2 * n + j;
        float v;
        if (s.linear_before_reset) {
          const float recurrent = dot(wt.r + row * n, h, n) + (wt.rb != nullptr ? wt.rb[row] : 0.0f);
          v = dot(wt.w + row * s.input, x, s.input) + (wt.wb != nullptr ? wt.wb[row] : 0.0f) + r[j] * recurrent;
        } else {
          float* reset_h = s.reset_h.data();
          if (j == 0) {
            for (int64_t k = 0; k < n; ++k) reset_h[k] = r[k] * h[k];
          }
          v = preActivation(s, wt, row, x, reset_h);
        }
        candidate[j] = std::tanh(clipped(s, v));
      }
      for (int64_t j = 0; j < n; ++j) h[j] = (1 - z[j]) * candidate[j] + z[j] * h[j];
      return;
    }
    case Cell::kLstm: {
      // Rows: input, output, forget, cell gates; peepholes: input, output, forget.
      for (int64_t j = 0; j < 4 * n; ++j) gates[j] = preActivation(s, wt, j, x, h);
      for (int64_t j = 0; j < n; ++j) {
        const float p_i = wt.peep != nullptr ? wt.peep[j] : 0.0f;
        const float p_o = wt.peep != nullptr ? wt.peep[n + j] : 0.0f;
        const float p_f = wt.peep != nullptr ? wt.peep[2 * n + j] : 0.0f;
        const float i = sigmoid(clipped(s, gates[j] + p_i * c[j]));
        const float f = s.input_forget ? 1 - i : sigmoid(clipped(s, gates[2 * n + j] + p_f * c[j]));
        const float candidate = std::tanh(clipped(s, gates[3 * n + j]));
        c[j] = f * c[j] + i * candidate;
        const float o = sigmoid(clipped(s, gates[n + j] + p_o * c[j]));
        h[j] = o * std::tanh(c[j]);
      }
      return;
    }
  }
}

void runRecurrent(const KernelCall& call) {
  const auto& s = static_cast<const RecurrentState&>(*call.state);
  const float* x = s.staging.input(call, 0);
  const float* w = s.staging.input(call, 1);
  const float* r = s.staging.input(call, 2);
  const float* bias = s.has_bias ? s.staging.input(call, kBias) : nullptr;
  const int32_t* lens = s.has_lens ? call.inputs[kLens].as<const int32_t>() : nullptr;
  const float* h0 = s.has_h0 ? s.staging.input(call, kInitialH) : nullptr;
  const float* c0 = s.has_c0 ? s.staging.input(call, kInitialC) : nullptr;
  const float* peep = s.has_peepholes ? s.staging.input(call, kPeepholes) : nullptr;
  float* y = call.output_count > 0 ? s.staging.output(call, 0) : nullptr;
  float* y_h = call.output_count > 1 ? s.staging.output(call, 1) : nullptr;
  float* y_c = call.output_count > 2 ? s.staging.output(call, 2) : nullptr;
  const int64_t n = s.hidden, g = gatesOf(s.cell) * n, d_count = s.directions;
  for (int64_t d = 0; d < d_count; ++d) {
    const Weights wt{w + d * g * s.input, r + d * g * n, bias == nullptr ? nullptr : bias + d * 2 * g,
                     bias == nullptr ? nullptr : bias + d * 2 * g + g, peep == nullptr ? nullptr : peep + d * 3 * n};
    const bool reverse = s.reverse_only || d == 1;
    for (int64_t b = 0; b < s.batch; ++b) {
      // [directions, batch, hidden], or [batch, directions, hidden] batch-major.
      const int64_t state_at = (s.batch_major ? b * d_count + d : d * s.batch + b) * n;
      if (h0 != nullptr) {
        std::copy(h0 + state_at, h0 + state_at + n, s.h.begin());
      } else {
        std::fill(s.h.begin(), s.h.end(), 0.0f);
      }
      if (c0 != nullptr) {
        std::copy(c0 + state_at, c0 + state_at + n, s.c.begin());
      } else {
        std::fill(s.c.begin(), s.c.end(), 0.0f);
      }
      const int64_t length = lens == nullptr ? s.seq : std::clamp<int64_t>(lens[b], 0, s.seq);
      for (int64_t i = 0; i < s.seq; ++i) {
        const int64_t t = reverse ? length - 1 - i : i;
        const bool active = i < length;
        const int64_t y_t = active ? t : i;  // the rows past the length are zeroed
        if (active) step(s, wt, x + (s.batch_major ? b * s.seq + t : t * s.batch + b) * s.input);
        if (y != nullptr) {
          float* row = y + (s.batch_major ? (b * s.seq + y_t) * d_count + d : (y_t * d_count + d) * s.batch + b) * n;
          if (active) {
            std::copy(s.h.begin(), s.h.end(), row);
          } else {
            std::fill(row, row + n, 0.0f);
          }
        }
      }
      if (y_h != nullptr) std::copy(s.h.begin(), s.h.end(), y_h + state_at);
      if (y_c != nullptr) std::copy(s.c.begin(), s.c.end(), y_c + state_at);
    }
  }
  s.staging.finish(call);
}

}  // namespace

void registerRecurrentKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"RNN", &prepareRnn, &runRecurrent});
  registry.add(KernelDef{"GRU", &prepareGru, &runRecurrent});
  registry.add(KernelDef{"LSTM", &prepareLstm, &runRecurrent});
}

}  // namespace kiln
