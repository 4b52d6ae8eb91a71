// Spatial-sampling operators: GridSample, AffineGrid, RoiAlign, DeformConv.
//
//   GridSample(X [N, C, D1..Dr], grid [N, O1..Or, r]) -> [N, C, O1..Or]
//   AffineGrid(theta [N, 2, 3] or [N, 3, 4], size [N, C, (D,) H, W])
//        -> [N, H, W, 2] or [N, D, H, W, 3]; size must be a constant
//   RoiAlign(X [N, C, H, W], rois [R, 4], batch_indices [R])
//        -> [R, C, output_height, output_width]
//   DeformConv(X, W, offset, B?, mask?) -> Conv's output shape
//
// RoiAlign is registered from opset 16, whose default
// coordinate_transformation_mode (half_pixel) the kernel implements; opset
// 10's models, whose behaviour is output_half_pixel without the attribute,
// are reported unsupported rather than run differently.
#include <fmt/ranges.h>

#include "ops/delegated_inference.h"
#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

void expectFloat(const InferenceContext& context, size_t index, const char* name) {
  const DType dtype = context.inputType(index).dtype;
  if (dtype != DType::kF32 && dtype != DType::kF64 && dtype != DType::kF16 && dtype != DType::kBF16) {
    context.fail("{} must be a float tensor, found {}", name, dtypeName(dtype));
  }
}

void gridSample(InferenceContext& context) {
  expectFloat(context, 1, "grid");
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* x = knownShape(context, 0);
  const std::vector<Dim>* grid = knownShape(context, 1);
  if (!x || !grid) {
    context.output(0) = ValueType{dtype, std::nullopt};
    return;
  }
  const size_t spatial = x->size() < 3 ? 0 : x->size() - 2;
  if (spatial == 0 || grid->size() != x->size() || !(grid->back() == Dim::known(static_cast<int64_t>(spatial)) ||
                                                        !grid->back().isKnown())) {
    context.fail("X {} and grid {} must be [N, C, D1..Dr] and [N, O1..Or, r]", dimsText(*x), dimsText(*grid));
  }
  std::vector<Dim> out{(*grid)[0], (*x)[1]};
  out.insert(out.end(), grid->begin() + 1, grid->end() - 1);
  context.output(0) = ValueType{dtype, out};
}

void affineGrid(InferenceContext& context) {
  expectFloat(context, 0, "theta");
  const DType dtype = context.inputType(0).dtype;
  const auto size = context.constantInts(1);
  const std::vector<Dim>* size_shape = knownShape(context, 1);
  if (size_shape && (size_shape->size() != 1 || ((*size_shape)[0].isKnown() && (*size_shape)[0].size != 4 &&
                                                  (*size_shape)[0].size != 5))) {
    context.fail("size must be [N, C, H, W] or [N, C, D, H, W], found a tensor {}", dimsText(*size_shape));
  }
  if (!size) {
    // The rank is known from size's length; the sizes only from its values.
    std::optional<std::vector<Dim>> out;
    if (size_shape && (*size_shape)[0].isKnown()) {
      const int64_t r = (*size_shape)[0].size - 2;
      out = std::vector<Dim>(static_cast<size_t>(r + 2));
      out->back() = Dim::known(r);
    }
    context.output(0) = ValueType{dtype, out};
    return;
  }
  const size_t r = size->size() - 2;
  if (const std::vector<Dim>* theta = knownShape(context, 0)) {
    const std::vector<Dim> want{Dim::known((*size)[0]), Dim::known(static_cast<int64_t>(r)),
                                Dim::known(static_cast<int64_t>(r + 1))};
    bool fits = theta->size() == 3;
    for (size_t i = 0; fits && i < 3; ++i) fits = !(*theta)[i].isKnown() || (*theta)[i] == want[i];
    if (!fits) context.fail("theta {} must be {} for size [{}]", dimsText(*theta), dimsText(want), fmt::join(*size, ", "));
  }
  std::vector<Dim> out{Dim::known((*size)[0])};
  for (size_t i = 2; i < size->size(); ++i) {
    if ((*size)[i] < 1) context.fail("size [{}] must be positive", fmt::join(*size, ", "));
    out.push_back(Dim::known((*size)[i]));
  }
  out.push_back(Dim::known(static_cast<int64_t>(r)));
  context.output(0) = ValueType{dtype, out};
}

void roiAlign(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  expectFloat(context, 0, "X");
  if (context.inputType(1).dtype != dtype) context.fail("rois must have the type of X, found {}", dtypeName(context.inputType(1).dtype));
  const std::vector<Dim>* x = knownShape(context, 0);
  const std::vector<Dim>* rois = knownShape(context, 1);
  if (x && x->size() != 4) context.fail("X must be [N, C, H, W], found {}", dimsText(*x));
  if (rois && (rois->size() != 2 || ((*rois)[1].isKnown() && (*rois)[1].size != 4))) {
    context.fail("rois must be [R, 4], found {}", dimsText(*rois));
  }
  const int64_t height = context.node().intAttribute("output_height", 1);
  const int64_t width = context.node().intAttribute("output_width", 1);
  if (height < 1 || width < 1) context.fail("output_height and output_width must be positive, found {} and {}", height, width);
  const std::string mode = context.node().stringAttribute("mode", "avg");
  if (mode != "avg" && mode != "max") context.fail("mode '{}' is not avg or max", mode);
  context.output(0) = ValueType{dtype, std::vector<Dim>{rois ? (*rois)[0] : Dim{}, x ? (*x)[1] : Dim{},
                                                        Dim::known(height), Dim::known(width)}};
}

void deformConv(InferenceContext& context) {
  expectFloat(context, 0, "X");
  context.output(0) = ValueType{context.inputType(0).dtype, delegatedShape(context, "Conv", {0, 1, 3})};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, 1, std::move(infer)});
}

}  // namespace

void registerSamplingOps(OpRegistry& registry) {
  add(registry, "GridSample", 16, 2, 2, gridSample);  // 16: 4-D, bilinear/bicubic; 20: N-D, linear/cubic
  add(registry, "GridSample", 20, 2, 2, gridSample);
  add(registry, "AffineGrid", 20, 2, 2, affineGrid);
  add(registry, "RoiAlign", 16, 3, 3, roiAlign);
  add(registry, "DeformConv", 19, 3, 5, deformConv);
}

}  // namespace kiln
