#include "passes/upsample_fusion.h"

#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/elementwise_program.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// Output row y reads input row y / f (floor) for every whole factor f.
bool nearestIsFloorDivision(const Node& resize) {
  if (resize.stringAttribute("mode", "nearest") != "nearest" || resize.intAttribute("antialias", 0) != 0 ||
      resize.hasAttribute("axes")) {
    return false;
  }
  if (resize.inputs.size() == 2) return true;  // opset 10: Resize(X, scales), asymmetric and floor
  const std::string coordinates = resize.stringAttribute("coordinate_transformation_mode", "half_pixel");
  const std::string rounding = resize.stringAttribute("nearest_mode", "round_prefer_floor");
  if (coordinates == "asymmetric" || coordinates == "tf_half_pixel_for_nearest") return rounding == "floor";
  if (coordinates == "half_pixel" || coordinates == "pytorch_half_pixel") {
    return rounding == "round_prefer_floor" || rounding == "round_prefer_ceil";
  }
  return false;
}

// The factors (fh, fw) by which kiln.NhwcResize `resize` upsamples, when it
// qualifies (see the header).
std::optional<std::pair<int64_t, int64_t>> upsamplingFactors(const Graph& graph, const Node& resize) {
  if (resize.domain != "kiln" || resize.op_type != "NhwcResize" || resize.outputs.size() != 1 ||
      resize.inputs.empty() || !nearestIsFloorDivision(resize)) {
    return std::nullopt;
  }
  const auto in = staticShape(graph, resize.inputs[0]);
  const auto out = staticShape(graph, resize.outputs[0]);
  if (!in || !out || in->size() != 4 || out->size() != 4 || graph.value(resize.inputs[0]).type.dtype != DType::kF32) {
    return std::nullopt;
  }
  const std::vector<int64_t>& i = *in;
  const std::vector<int64_t>& o = *out;
  if (i[0] != o[0] || i[3] != o[3] || i[1] <= 0 || i[2] <= 0 || o[1] % i[1] != 0 || o[2] % i[2] != 0) {
    return std::nullopt;
  }
  const int64_t fh = o[1] / i[1], fw = o[2] / i[2];
  // Scales, when they decide, must be the factors exactly (2.0000001 maps
  // some rows elsewhere); sizes give them exactly.
  const size_t scales_input = resize.inputs.size() == 2 ? 1 : 2;
  const bool has_sizes = resize.inputs.size() > 3 && resize.inputs[3] != kNoValue;
  if (!has_sizes) {
    if (scales_input >= resize.inputs.size() || resize.inputs[scales_input] == kNoValue) return std::nullopt;
    const Value& scales = graph.value(resize.inputs[scales_input]);
    if (!scales.initializer || scales.initializer->info.dtype != DType::kF32 ||
        scales.initializer->info.numElements() != 4) {
      return std::nullopt;
    }
    float s[4];
    std::memcpy(s, scales.initializer->bytes.data(), sizeof s);
    // In the ONNX layout: [N, C, H, W].
    if (s[0] != 1.0f || s[1] != 1.0f || s[2] != static_cast<float>(fh) || s[3] != static_cast<float>(fw)) {
      return std::nullopt;
    }
  }
  if (fh == 1 && fw == 1) return std::nullopt;
  return std::make_pair(fh, fw);
}

}  // namespace

size_t fuseUpsampling(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t fused = 0;
  for (NodeId id : graph.nodeIds()) {
    Node& node = graph.node(id);
    if (node.removed || node.domain != "kiln" || node.op_type != "FusedElementwise" ||
        node.hasAttribute(std::string(kProgramUpsampleAttribute)) || node.outputs.size() != 1) {
      continue;
    }
    const auto out = staticShape(graph, node.outputs[0]);
    if (!out) continue;
    std::vector<int64_t> factors(2 * node.inputs.size(), 1);
    std::vector<std::pair<size_t, ValueId>> replaced;  // input, the Resize's input
    bool full_input = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId input = node.inputs[i];
      const Value& value = graph.value(input);
      std::optional<std::pair<int64_t, int64_t>> f;
      if (value.kind == ValueKind::kNodeOutput && !pinned.contains(input) && replaced.size() < kMaxUpsampledInputs) {
        bool only_here = true;
        for (const Use& use : value.users) only_here = only_here && use.node == id;
        if (only_here) f = upsamplingFactors(graph, graph.node(value.producer));
      }
      if (f) {
        factors[2 * i] = f->first;
        factors[2 * i + 1] = f->second;
        replaced.emplace_back(i, graph.node(value.producer).inputs[0]);
      } else {
        full_input = full_input || staticShape(graph, input) == out;
      }
    }
    if (replaced.empty() || !full_input) continue;
    for (const auto& [i, small] : replaced) graph.setNodeInput(id, i, small);
    graph.node(id).attributes[std::string(kProgramUpsampleAttribute)] = factors;
    fused += replaced.size();
  }
  return fused;
}

}  // namespace kiln
