#include "kernels/cuda/tiled_conv_transpose.h"

#include <string>
#include <vector>

#include "kernels/cpu/setup_helpers.h"
#include "kernels/cuda/conv_launch.h"
#include "kernels/cuda/cuda_queue.h"

namespace kiln::cuda {
namespace {

struct TiledState final : KernelState {
  TiledGeometry geometry;
  bool has_bias = false;
};

bool all(const std::vector<int64_t>& values, int64_t expected) {
  for (int64_t v : values) {
    if (v != expected) return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<KernelState> prepareTiledConvTranspose(const KernelSetup& setup) {
  if (setup.inputs.size() < 2 || setup.inputs.size() > 3 || setup.outputs.size() != 1) return nullptr;
  if (!setup_helpers::presentInputsAre(setup, DType::kF32)) return nullptr;
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& w = setup.inputs[1];  // [C_in, C_out, kh, kw]
  const TensorInfo& y = setup.outputs[0];
  if (x.shape.size() != 4 || w.shape.size() != 4 || y.shape.size() != 4 || w.shape[0] != x.shape[1]) return nullptr;
  const ParamMap& p = setup.params;
  const std::vector<int64_t> strides = p.getInts("strides", {1, 1});
  const std::string auto_pad = p.getString("auto_pad", "NOTSET");
  if (p.getInt("group", 1) != 1 || strides.size() != 2 || strides[0] != w.shape[2] || strides[1] != w.shape[3] ||
      !all(p.getInts("pads", {0, 0, 0, 0}), 0) || !all(p.getInts("dilations", {1, 1}), 1) ||
      !all(p.getInts("output_padding", {0, 0}), 0) || (auto_pad != "NOTSET" && auto_pad != "VALID") ||
      p.has("output_shape")) {
    return nullptr;
  }
  TiledGeometry g;
  g.batch = x.shape[0];
  g.in_channels = x.shape[1];
  g.out_channels = w.shape[1];
  g.in_h = x.shape[2];
  g.in_w = x.shape[3];
  g.kernel_h = w.shape[2];
  g.kernel_w = w.shape[3];
  if (y.shape != std::vector<int64_t>{g.batch, g.out_channels, g.in_h * g.kernel_h, g.in_w * g.kernel_w} ||
      y.numElements() >= (1ull << 31) || x.numElements() >= (1ull << 31) || y.numElements() == 0) {
    return nullptr;
  }
  auto state = std::make_unique<TiledState>();
  state->geometry = g;
  state->has_bias = setup_helpers::present(setup, 2);
  return state;
}

bool isTiledConvTranspose(const KernelState* state) { return dynamic_cast<const TiledState*>(state) != nullptr; }

void runTiledConvTranspose(const KernelCall& call) {
  const auto& s = *static_cast<const TiledState*>(call.state);
  launchTiledConvTranspose(call.inputs[0].as<const float>(), call.inputs[1].as<const float>(),
                           s.has_bias ? call.inputs[2].as<const float>() : nullptr, call.outputs[0].as<float>(),
                           s.geometry, queueOf(call.queue).stream);
}

}  // namespace kiln::cuda
