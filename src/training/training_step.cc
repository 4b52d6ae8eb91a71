#include "training/training_step.h"

#include <fmt/format.h>

#include <cstring>

#include "kiln/error.h"
#include "passes/plugin_binding.h"
#include "plugins/plugin_registry.h"
#include "plugins/replica_all_reduce.h"
#include "training/autodiff.h"
#include "training/gradient_rules.h"

namespace kiln {
namespace {

// A state variable of `like`'s type (or a scalar), zeros, as a new input.
ValueId stateInput(Graph& graph, TrainingStep& step, const std::string& name, DType dtype,
                   const std::vector<int64_t>& shape) {
  const TensorInfo info{dtype, shape};
  std::vector<std::byte> zeros(info.sizeInBytes());
  const std::string unique = uniqueName(graph, name);
  step.state[unique] = makeConstant(info, std::move(zeros));
  return graph.addInput(unique, ValueType::tensor(dtype, shape));
}

// The gradients averaged over the processes by the op `all_reduce`
// ("domain.name", a registered plugin or host op, bound here): flattened and concatenated, so that one collective call
// per step carries them all, then cut and reshaped back.
std::vector<ValueId> allReduced(GradientBuilder& b, const std::vector<ValueId>& gradients, const std::string& all_reduce) {
  const size_t dot = all_reduce.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == all_reduce.size()) {
    throw UsageError(fmt::format("gradient_all_reduce '{}' must name an op as domain.name", all_reduce));
  }
  std::vector<ValueId> flat;
  std::vector<int64_t> sizes;
  for (ValueId g : gradients) {
    int64_t size = 1;
    for (int64_t d : b.shapeOf(g)) size *= d;
    sizes.push_back(size);
    flat.push_back(b.add("Reshape", {g, b.int64s({size})}));
  }
  const ValueId joined = flat.size() == 1 ? flat[0] : b.add("Concat", flat, {{"axis", int64_t{0}}});
  if (all_reduce == kReplicaAllReduce) registerReplicaAllReduce();
  const std::string domain = all_reduce.substr(0, dot), name = all_reduce.substr(dot + 1);
  const PluginOp* op = PluginRegistry::global().findOp(domain, name, 1);
  if (op == nullptr) {
    throw UsageError(fmt::format("gradient_all_reduce: no op {} is registered in this process (kiln.distributed "
                                 "registers its MPI one; a plugin or kiln.register_host_op can give another)",
                                 all_reduce));
  }
  Graph& graph = b.graph();
  const NodeId reduce = graph.addNode("Plugin", {joined}, {uniqueName(graph, "gradients.all_reduced")},
                                      boundPluginAttributes(*op, "{}"), "kiln");
  graph.node(reduce).name = "gradient_all_reduce";
  const ValueId averaged = graph.node(reduce).outputs[0];
  std::vector<ValueId> result;
  int64_t at = 0;
  for (size_t i = 0; i < gradients.size(); ++i) {
    const ValueId piece = b.add("Slice", {averaged, b.int64s({at}), b.int64s({at + sizes[i]}), b.int64s({0})});
    result.push_back(b.add("Reshape", {piece, b.int64s(b.shapeOf(gradients[i]))}));
    at += sizes[i];
  }
  return result;
}

}  // namespace

TrainingStep appendTrainingStep(Graph& graph, const std::map<std::string, int64_t>& opsets, ValueId loss,
                                const std::vector<ValueId>& weights, const Optimizer& optimizer, uint32_t accumulation,
                                const std::string& all_reduce) {
  if (accumulation < 1) throw UsageError("gradient_accumulation must be 1 or more");
  if (optimizer.learning_rate <= 0) throw UsageError(fmt::format("the learning rate must be positive, got {}", optimizer.learning_rate));
  if (optimizer.momentum < 0 || optimizer.weight_decay < 0) {
    throw UsageError("momentum and weight_decay must be 0 or more");
  }
  std::vector<ValueId> gradients = appendGradients(graph, loss, weights, opsets);
  GradientBuilder b(graph, opsets);
  if (!all_reduce.empty()) gradients = allReduced(b, gradients, all_reduce);
  TrainingStep step;
  // Accumulation: a micro-step count and a sum per weight; `apply` is 1 on
  // every accumulation-th run, 0 on the others.
  ValueId apply = kNoValue;
  if (accumulation > 1) {
    const ValueId micro = stateInput(graph, step, "optimizer.micro_step", DType::kF32, {});
    const ValueId micro_next = b.add("Add", {micro, b.scalar(1.0, DType::kF32)});
    apply = b.add("Cast", {b.add("Greater", {micro_next, b.scalar(accumulation - 0.5, DType::kF32)})},
                  {{"to", static_cast<int64_t>(DType::kF32)}});
    const ValueId keep = b.add("Sub", {b.scalar(1.0, DType::kF32), apply});
    step.updates.emplace_back(graph.value(micro).name, b.add("Mul", {micro_next, keep}));
    for (size_t i = 0; i < weights.size(); ++i) {
      const std::string name = graph.value(weights[i]).name;
      const ValueId sum = stateInput(graph, step, name + ".accumulated", b.dtypeOf(weights[i]), b.shapeOf(weights[i]));
      const ValueId sum_next = b.add("Add", {sum, gradients[i]});
      step.updates.emplace_back(graph.value(sum).name, b.add("Mul", {sum_next, keep}));
      gradients[i] = b.add("Div", {sum_next, b.scalar(accumulation, DType::kF32)});
    }
  }
  const size_t first_gated = step.updates.size();
  // Adam's step count, shared by every weight: t + 1 this step.
  ValueId t = kNoValue;
  if (optimizer.kind != Optimizer::Kind::kSgd) {
    const ValueId count = stateInput(graph, step, "optimizer.step", DType::kF32, {});
    t = b.add("Add", {count, b.scalar(1.0, DType::kF32)});
    step.updates.emplace_back(graph.value(count).name, t);
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    const ValueId w = weights[i];
    const std::string name = graph.value(w).name;  // a copy: adding values moves the graph's storage
    const DType dtype = b.dtypeOf(w);
    if (dtype != DType::kF32) {
      throw UsageError(fmt::format("weight '{}' is {}; kiln trains f32 weights", name, dtypeName(dtype)));
    }
    const std::vector<int64_t> shape = b.shapeOf(w);
    const auto scalar = [&](double value) { return b.scalar(value, dtype); };
    ValueId g = gradients[i];
    const bool decoupled = optimizer.kind == Optimizer::Kind::kAdamW;
    if (optimizer.weight_decay > 0 && !decoupled) g = b.add("Add", {g, b.add("Mul", {w, scalar(optimizer.weight_decay)})});
    ValueId direction = g;
    if (optimizer.kind == Optimizer::Kind::kSgd) {
      if (optimizer.momentum > 0) {
        const ValueId v = stateInput(graph, step, name + ".momentum", dtype, shape);
        direction = b.add("Add", {b.add("Mul", {v, scalar(optimizer.momentum)}), g});
        step.updates.emplace_back(graph.value(v).name, direction);
      }
    } else {
      const ValueId m = stateInput(graph, step, name + ".adam_m", dtype, shape);
      const ValueId v = stateInput(graph, step, name + ".adam_v", dtype, shape);
      const ValueId m_next = b.add("Add", {b.add("Mul", {m, scalar(optimizer.beta1)}), b.add("Mul", {g, scalar(1.0 - optimizer.beta1)})});
      const ValueId v_next = b.add("Add", {b.add("Mul", {v, scalar(optimizer.beta2)}),
                                           b.add("Mul", {b.add("Mul", {g, g}), scalar(1.0 - optimizer.beta2)})});
      step.updates.emplace_back(graph.value(m).name, m_next);
      step.updates.emplace_back(graph.value(v).name, v_next);
      // Bias corrections 1 - beta^t.
      const ValueId c1 = b.add("Sub", {scalar(1.0), b.add("Pow", {scalar(optimizer.beta1), t})});
      const ValueId c2 = b.add("Sub", {scalar(1.0), b.add("Pow", {scalar(optimizer.beta2), t})});
      const ValueId m_hat = b.add("Div", {m_next, c1});
      const ValueId v_hat = b.add("Div", {v_next, c2});
      direction = b.add("Div", {m_hat, b.add("Add", {b.add("Sqrt", {v_hat}), scalar(optimizer.epsilon)})});
      if (decoupled && optimizer.weight_decay > 0) {
        direction = b.add("Add", {direction, b.add("Mul", {w, scalar(optimizer.weight_decay)})});
      }
    }
    const ValueId w_next = b.add("Sub", {w, b.add("Mul", {direction, scalar(optimizer.learning_rate)})});
    step.updates.emplace_back(name, w_next);
  }
  // Between the accumulation's steps, the weights and the optimiser's state
  // keep their values: x + apply * (x_next - x).
  if (apply != kNoValue) {
    for (size_t u = first_gated; u < step.updates.size(); ++u) {
      const ValueId old_value = *graph.findValue(step.updates[u].first);
      const ValueId change = b.add("Sub", {step.updates[u].second, old_value});
      step.updates[u].second = b.add("Add", {old_value, b.add("Mul", {change, apply})});
    }
  }
  return step;
}

}  // namespace kiln
