// Signal-processing operators: DFT, STFT, the window functions
// (HannWindow, HammingWindow, BlackmanWindow) and MelWeightMatrix.
//
// Their output sizes depend on the values of some inputs (DFT's dft_length
// and axis, STFT's frame_step and frame_length, a window's size, the mel
// matrix's bin counts). When those inputs are constants the sizes are
// known; otherwise they are left unknown, and compiling stops on the
// unknown shape (kiln needs static shapes) until the inputs are fixed.
//
// Complex values are a last axis of 2 (real, imaginary); a real signal may
// have a last axis of 1.
#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

// The single integer of constant input `index`, or nullopt.
std::optional<int64_t> constantScalar(const InferenceContext& context, size_t index) {
  if (!context.hasInput(index)) return std::nullopt;
  const auto values = context.constantInts(index);
  if (!values) return std::nullopt;
  if (values->size() != 1) context.fail("input {} must hold one value, found {}", index, values->size());
  return values->front();
}

void expectIntegerInput(const InferenceContext& context, size_t index, const char* name) {
  if (!context.hasInput(index)) return;
  const DType dtype = context.inputType(index).dtype;
  if (dtype != DType::kI32 && dtype != DType::kI64) context.fail("{} must be i32 or i64, found {}", name, dtypeName(dtype));
}

Dim positive(const InferenceContext& context, std::optional<int64_t> value, const char* name) {
  if (!value) return Dim{};
  if (*value < 1) context.fail("{} must be positive, found {}", name, *value);
  return Dim::known(*value);
}

// output_datatype (default f32) of the generator operators.
DType outputDatatype(const InferenceContext& context) {
  const int64_t code = context.node().intAttribute("output_datatype", static_cast<int64_t>(DType::kF32));
  if (code <= 0 || code > 255 || !isValidDType(static_cast<uint8_t>(code))) {
    context.fail("output_datatype {} is not a type kiln supports", code);
  }
  return static_cast<DType>(code);
}

// ---------------------------------------------------------------------- DFT

// Opset 17 takes the axis as an attribute (default 1), opset 20 as input 2
// (default -2); either way it may not be the last (complex) axis.
void dft(InferenceContext& context, bool axis_input) {
  const DType dtype = context.inputType(0).dtype;
  expectIntegerInput(context, 1, "dft_length");
  expectIntegerInput(context, 2, "axis");
  const std::vector<Dim>* x = knownShape(context, 0);
  if (!x) {
    context.output(0) = ValueType{dtype, std::nullopt};
    return;
  }
  if (x->size() < 2 || (x->back().isKnown() && x->back().size != 1 && x->back().size != 2)) {
    context.fail("needs an input [..., signal, 1 or 2] (real or complex), found {}", dimsText(*x));
  }
  const bool inverse = context.node().intAttribute("inverse", 0) != 0;
  const bool onesided = context.node().intAttribute("onesided", 0) != 0;
  std::optional<int64_t> axis = axis_input ? -2 : context.node().intAttribute("axis", 1);
  if (axis_input && context.hasInput(2)) axis = constantScalar(context, 2);
  std::vector<Dim> out = *x;
  out.back() = Dim::known(inverse && onesided ? 1 : 2);
  if (!axis) {
    // Which axis is unknown: a full-length transform keeps every size.
    if (onesided || context.hasInput(1)) out.assign(x->size(), Dim{});
    out.back() = Dim::known(inverse && onesided ? 1 : 2);
    context.output(0) = ValueType{dtype, out};
    return;
  }
  const size_t a = normalizeAxis(context, *axis, x->size());
  if (a == x->size() - 1) context.fail("axis {} is the last (complex) axis of {}", *axis, dimsText(*x));
  Dim length;
  if (context.hasInput(1)) {
    length = positive(context, constantScalar(context, 1), "dft_length");
  } else if ((*x)[a].isKnown()) {
    length = Dim::known(inverse && onesided ? multiplyDims(context, 2, (*x)[a].size - 1) : (*x)[a].size);
    if (length.size < 1) context.fail("a one-sided inverse DFT needs 2 or more bins along axis {}", a);
  }
  out[a] = length.isKnown() && onesided && !inverse ? Dim::known(length.size / 2 + 1) : length;
  context.output(0) = ValueType{dtype, out};
}

// --------------------------------------------------------------------- STFT

// STFT(signal [batch, length, 1 or 2], frame_step, window? [frame_length],
// frame_length?) -> [batch, frames, bins, 2] with frames = 1 + (length -
// frame_length) / frame_step and bins = frame_length / 2 + 1 when onesided
// (the default), frame_length otherwise.
void stft(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  expectIntegerInput(context, 1, "frame_step");
  expectIntegerInput(context, 3, "frame_length");
  const std::vector<Dim>* signal = knownShape(context, 0);
  if (signal && (signal->size() != 3 || (signal->back().isKnown() && signal->back().size > 2))) {
    context.fail("needs a signal [batch, length, 1 or 2], found {}", dimsText(*signal));
  }
  Dim frame_length;
  if (context.hasInput(3)) {
    frame_length = positive(context, constantScalar(context, 3), "frame_length");
  } else if (const std::vector<Dim>* window = knownShape(context, 2)) {
    if (window->size() != 1) context.fail("the window must be 1-D, found {}", dimsText(*window));
    frame_length = (*window)[0];
  } else if (!context.hasInput(2) && signal) {
    frame_length = (*signal)[1];
  }
  if (const std::vector<Dim>* window = knownShape(context, 2); window && frame_length.isKnown() &&
                                                               (*window)[0].isKnown() && (*window)[0] != frame_length) {
    context.fail("the window {} must have frame_length ({}) values", dimsText(*window), frame_length.size);
  }
  const Dim step = positive(context, constantScalar(context, 1), "frame_step");
  const bool onesided = context.node().intAttribute("onesided", 1) != 0;
  Dim frames;
  const Dim length = signal ? (*signal)[1] : Dim{};
  if (length.isKnown() && frame_length.isKnown() && step.isKnown()) {
    if (frame_length.size > length.size) {
      context.fail("frame_length {} is longer than the signal ({})", frame_length.size, length.size);
    }
    frames = Dim::known(1 + (length.size - frame_length.size) / step.size);
  }
  const Dim bins = frame_length.isKnown() && onesided ? Dim::known(frame_length.size / 2 + 1) : frame_length;
  context.output(0) = ValueType{dtype, std::vector<Dim>{signal ? (*signal)[0] : Dim{}, frames, bins, Dim::known(2)}};
}

// ------------------------------------------------- window functions, mel

void window(InferenceContext& context) {
  expectIntegerInput(context, 0, "size");
  context.output(0) = ValueType{outputDatatype(context), std::vector<Dim>{positive(context, constantScalar(context, 0), "size")}};
}

// MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
// upper_edge_hertz) -> [dft_length / 2 + 1, num_mel_bins].
void melWeightMatrix(InferenceContext& context) {
  for (size_t i = 0; i < 3; ++i) expectIntegerInput(context, i, "num_mel_bins, dft_length and sample_rate");
  const Dim mel_bins = positive(context, constantScalar(context, 0), "num_mel_bins");
  const Dim dft_length = positive(context, constantScalar(context, 1), "dft_length");
  const Dim spectrogram_bins = dft_length.isKnown() ? Dim::known(dft_length.size / 2 + 1) : Dim{};
  context.output(0) = ValueType{outputDatatype(context), std::vector<Dim>{spectrogram_bins, mel_bins}};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, 1, std::move(infer)});
}

}  // namespace

void registerSignalOps(OpRegistry& registry) {
  add(registry, "DFT", 17, 1, 2, [](InferenceContext& c) { dft(c, false); });
  add(registry, "DFT", 20, 1, 3, [](InferenceContext& c) { dft(c, true); });
  add(registry, "STFT", 17, 2, 4, stft);
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) add(registry, op, 17, 1, 1, window);
  add(registry, "MelWeightMatrix", 17, 5, 5, melWeightMatrix);
}

}  // namespace kiln
