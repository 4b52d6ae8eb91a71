// Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12).
//
// Both take scores [N, C, d1, ...] and integer targets [N, d1, ...] (and
// optional per-class weights [C]). The loss has the targets' shape with
// reduction "none", else it is a scalar ("mean", the default, or "sum").
// SoftmaxCrossEntropyLoss's optional second output is the log-probabilities,
// of the scores' shape.
#include <string>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

void loss(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const DType target = context.inputType(1).dtype;
  if (target != DType::kI32 && target != DType::kI64) {
    context.fail("the target must be i32 or i64, found {}", dtypeName(target));
  }
  const std::string reduction = context.node().stringAttribute("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean") {
    context.fail("reduction is '{}', not none, sum or mean", reduction);
  }
  const std::vector<Dim>* x = knownShape(context, 0);
  const std::vector<Dim>* t = knownShape(context, 1);
  if (x && x->size() < 2) context.fail("the input must be [N, C, ...], found {}", dimsText(*x));
  if (x && t) {
    bool agree = t->size() + 1 == x->size();
    for (size_t i = 0; agree && i < t->size(); ++i) {
      const Dim& xd = (*x)[i == 0 ? 0 : i + 1];
      agree = !xd.isKnown() || !(*t)[i].isKnown() || xd.size == (*t)[i].size;
    }
    if (!agree) context.fail("the target {} does not match the input {} without its class axis", dimsText(*t), dimsText(*x));
  }
  if (const std::vector<Dim>* w = knownShape(context, 2)) {
    if (w->size() != 1 || (x && (*x)[1].isKnown() && (*w)[0].isKnown() && (*w)[0].size != (*x)[1].size)) {
      context.fail("the weight {} must be [C]", dimsText(*w));
    }
  }
  if (reduction == "none") {
    context.output(0) = ValueType{dtype, t ? std::optional<std::vector<Dim>>(*t) : std::nullopt};
  } else {
    context.output(0) = ValueType{dtype, std::vector<Dim>{}};
  }
  if (context.outputCount() > 1) copyInputType(context, 0, 1);
}

}  // namespace

void registerLossOps(OpRegistry& registry) {
  registry.add(OpSchema{"", "NegativeLogLikelihoodLoss", 12, 2, 3, 1, 1, loss});
  registry.add(OpSchema{"", "SoftmaxCrossEntropyLoss", 12, 2, 3, 1, 2, loss});
}

}  // namespace kiln
