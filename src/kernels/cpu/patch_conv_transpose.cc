#include "kernels/cpu/patch_conv_transpose.h"

#include "kernels/cpu/onednn_support.h"

namespace kiln {

using onednn::Dims;
using onednn::plainDesc;

dnnl::memory::desc patchOutputDesc(const PatchGeometry& g) {
  return plainDesc({g.batch * g.height, g.kernel_h, g.width, g.kernel_w * g.out_channels});
}

PatchConvTranspose preparePatchConvTranspose(const PatchGeometry& g, const float* w, const float* bias,
                                             const dnnl::primitive_attr& attr) {
  const int64_t columns = g.kernel_w * g.out_channels;  // (b, oc)
  // V[a][c][b OC + oc] = W[c][oc][a][b].
  std::vector<float> v(static_cast<size_t>(g.kernel_h * g.in_channels * columns));
  for (int64_t a = 0; a < g.kernel_h; ++a) {
    for (int64_t c = 0; c < g.in_channels; ++c) {
      for (int64_t b = 0; b < g.kernel_w; ++b) {
        for (int64_t oc = 0; oc < g.out_channels; ++oc) {
          v[static_cast<size_t>((a * g.in_channels + c) * columns + b * g.out_channels + oc)] =
              w[((c * g.out_channels + oc) * g.kernel_h + a) * g.kernel_w + b];
        }
      }
    }
  }
  PatchConvTranspose patch;
  patch.src = plainDesc({g.batch * g.height, 1, g.width, g.in_channels});
  patch.dst = patchOutputDesc(g);
  const Dims weight_dims{1, g.kernel_h, g.in_channels, columns};
  const dnnl::memory::desc any_weights(weight_dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
  if (bias != nullptr) {
    patch.bias = plainDesc({1, 1, 1, columns});
    for (int64_t b = 0; b < g.kernel_w; ++b) patch.bias_row.insert(patch.bias_row.end(), bias, bias + g.out_channels);
  }
  const dnnl::engine& engine = onednn::cpuEngine();
  const auto desc = bias != nullptr ? dnnl::matmul::desc(patch.src, any_weights, patch.bias, patch.dst)
                                    : dnnl::matmul::desc(patch.src, any_weights, patch.dst);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine);
  patch.primitive = dnnl::matmul(pd);
  patch.weights = pd.weights_desc();
  patch.scratchpad = pd.scratchpad_desc();
  patch.packed_weights =
      onednn::reorderConstant(plainDesc(weight_dims), reinterpret_cast<const std::byte*>(v.data()), patch.weights);
  return patch;
}

}  // namespace kiln
