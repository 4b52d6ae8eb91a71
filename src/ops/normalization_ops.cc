// Normalisations without a schema elsewhere: LpNormalization (opset 1) and
// MeanVarianceNormalization (opset 9). (BatchNormalization,
// InstanceNormalization, LayerNormalization, GroupNormalization and LRN are
// in nn_ops.cc, RMSNormalization in transformer_ops.cc.) Both keep their
// input's type.
#include <string>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

void lpNormalization(InferenceContext& context) {
  const int64_t p = context.node().intAttribute("p", 2);
  if (p != 1 && p != 2) context.fail("p is {}; only 1 and 2 are defined", p);
  if (const std::vector<Dim>* x = knownShape(context, 0)) {
    normalizeAxis(context, context.node().intAttribute("axis", -1), x->size());
  }
  copyInputType(context);
}

void meanVarianceNormalization(InferenceContext& context) {
  if (const std::vector<Dim>* x = knownShape(context, 0)) {
    normalizeAxes(context, context.node().intsAttribute("axes", {0, 2, 3}), x->size());
  }
  copyInputType(context);
}

}  // namespace

void registerNormalizationOps(OpRegistry& registry) {
  registry.add(OpSchema{"", "LpNormalization", 1, 1, 1, 1, 1, lpNormalization});
  registry.add(OpSchema{"", "MeanVarianceNormalization", 9, 1, 1, 1, 1, meanVarianceNormalization});
}

}  // namespace kiln
