// A channels-last ConvTranspose whose kernel equals its stride, as one
// oneDNN matmul.
//
// With kernel == stride, no pads and no dilation, each input pixel paints
// its own KH x KW patch of the output and patches do not overlap: the 2x2
// stride-2 upsampling of U-Nets and of the DBNet text detectors' heads. The
// output pixel (KH i + a, KW j + b) takes channel oc from input pixel (i, j)
// alone: y[n, KH i + a, KW j + b, oc] = sum_c x[n, i, j, c] W[c, oc, a, b].
// In memory the [N, KH H, KW W, OC] output is exactly a dense
// [N H, KH, W, KW OC] tensor, so the whole ConvTranspose is the batched
// product
//
//   y[r, a, j, :] = x[r, j, :] . V[a]     (r over N H, V[a] = W[:, :, a, :]
//                                          as [IC, KW OC], columns (b, oc))
//
// with x broadcast over a and V over r, and a bias repeated KW times along
// the columns. oneDNN runs it with its brgemm matmul (post-ops included),
// where its channels-last deconvolution is 4x slower with a bias and falls
// back to its reference kernel with any post-op: PP-OCR's detector's
// 160x160x24 upsampling with its BatchNormalization and Relu took 1.0 ms
// for the deconvolution and 0.9 ms for the elementwise step after it, and
// takes 0.7 ms in all as a product.
#pragma once

#include <cstdint>
#include <dnnl.hpp>
#include <vector>

namespace kiln {

// The shapes of a patch ConvTranspose: input [N, H, W, IC], weights
// [IC, OC, KH, KW] (ONNX's layout, group 1), output [N, KH H, KW W, OC].
struct PatchGeometry {
  int64_t batch = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel_h = 0;
  int64_t kernel_w = 0;
};

// The matmul and its operands. The descriptors describe the call's tensors
// in the product's terms (the same bytes as the NHWC input and output).
struct PatchConvTranspose {
  dnnl::matmul primitive;
  dnnl::memory::desc src;
  dnnl::memory::desc weights;  // packed
  dnnl::memory::desc bias;     // [1, 1, 1, KW OC]; zero-sized without a bias
  dnnl::memory::desc dst;
  dnnl::memory::desc scratchpad;
  dnnl::memory packed_weights;
  std::vector<float> bias_row;  // the bias repeated KW times, empty without one
};

// The output described in the product's terms ([N H, KH, W, KW OC], dense),
// for a residual post-op's operand.
dnnl::memory::desc patchOutputDesc(const PatchGeometry& g);

// Builds the product for `g` with constant weights `w` (ONNX layout) and
// bias `bias` (OC values, or null), applying `attr` (its post-ops, scratchpad
// mode). Throws dnnl::error when oneDNN has no kernel for it.
PatchConvTranspose preparePatchConvTranspose(const PatchGeometry& g, const float* w, const float* bias,
                                             const dnnl::primitive_attr& attr);

}  // namespace kiln
