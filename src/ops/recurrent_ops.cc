// Recurrent layers: RNN, GRU and LSTM (opset 7; the layout attribute from
// 14).
//
// Inputs: X [seq, batch, input] ([batch, seq, input] with layout 1), W
// [directions, gates * hidden, input], R [directions, gates * hidden,
// hidden], then optional B, sequence_lens, initial_h (and for LSTM
// initial_c and P). Outputs: Y [seq, directions, batch, hidden] ([batch,
// seq, directions, hidden] with layout 1), Y_h [directions, batch, hidden]
// ([batch, directions, hidden]); LSTM adds Y_c, shaped as Y_h.
#include <string>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

// `quantized`: com.microsoft.DynamicQuantizeLSTM, whose W is [directions,
// input size, gates * hidden] (and the inputs from 8 on its weights' scales
// and zero points).
void recurrent(InferenceContext& context, int64_t gates, bool quantized = false) {
  const DType dtype = context.inputType(0).dtype;
  const int64_t hidden = context.node().intAttribute("hidden_size", 0);
  if (hidden < 1) context.fail("needs a positive 'hidden_size' attribute, found {}", hidden);
  const std::string direction = context.node().stringAttribute("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    context.fail("direction is '{}', not forward, reverse or bidirectional", direction);
  }
  const int64_t directions = direction == "bidirectional" ? 2 : 1;
  const int64_t layout = context.node().intAttribute("layout", 0);
  if (layout != 0 && layout != 1) context.fail("layout is {}, not 0 or 1", layout);
  if (const std::vector<Dim>* w = knownShape(context, 1)) {
    const bool fits = w->size() == 3 && (!(*w)[0].isKnown() || (*w)[0].size == directions) &&
                      (!(*w)[quantized ? 2 : 1].isKnown() || (*w)[quantized ? 2 : 1].size == gates * hidden);
    if (!fits) {
      if (quantized) context.fail("W {} must be [{}, input size, {}]", dimsText(*w), directions, gates * hidden);
      context.fail("W {} must be [{}, {}, input size]", dimsText(*w), directions, gates * hidden);
    }
  }
  const std::vector<Dim>* x = knownShape(context, 0);
  if (x && x->size() != 3) context.fail("X must be 3-D, found {}", dimsText(*x));
  for (size_t i = 0; i < context.outputCount(); ++i) context.output(i) = ValueType{dtype, std::nullopt};
  if (!x) return;
  const Dim seq = (*x)[layout == 0 ? 0 : 1];
  const Dim batch = (*x)[layout == 0 ? 1 : 0];
  const Dim d = Dim::known(directions);
  const Dim h = Dim::known(hidden);
  context.output(0) = ValueType{dtype, layout == 0 ? std::vector<Dim>{seq, d, batch, h} : std::vector<Dim>{batch, seq, d, h}};
  const std::vector<Dim> state = layout == 0 ? std::vector<Dim>{d, batch, h} : std::vector<Dim>{batch, d, h};
  for (size_t i = 1; i < context.outputCount(); ++i) context.output(i) = ValueType{dtype, state};
}

}  // namespace

void registerRecurrentOps(OpRegistry& registry) {
  registry.add(OpSchema{"", "RNN", 7, 3, 6, 0, 2, [](InferenceContext& c) { recurrent(c, 1); }});
  registry.add(OpSchema{"", "GRU", 7, 3, 6, 0, 2, [](InferenceContext& c) { recurrent(c, 3); }});
  registry.add(OpSchema{"", "LSTM", 7, 3, 8, 0, 3, [](InferenceContext& c) { recurrent(c, 4); }});
  // onnxruntime's contrib op: an LSTM with int8 weights whose products are
  // quantized dynamically (src/kernels/cpu/recurrent.cc).
  registry.add(OpSchema{"com.microsoft", "DynamicQuantizeLSTM", 1, 12, 12, 0, 3,
                        [](InferenceContext& c) { recurrent(c, 4, /*quantized=*/true); }});
}

}  // namespace kiln
