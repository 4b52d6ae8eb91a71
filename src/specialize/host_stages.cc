// The host stages of DynamicExecutor (executor_impl.h): a Loop whose body
// changes shape per iteration, run iteration by iteration (host_loop.h), and
// a node whose output shape depends on values that change per iteration,
// evaluated on the host; each followed by the rest of the model, specialized
// on what the stage gave.
#include <fmt/format.h>

#include <algorithm>

#include "compiler/runtime_shapes.h"
#include "kiln/error.h"
#include "specialize/executor_impl.h"
#include "specialize/host_loop.h"

namespace kiln {

Source DynamicExecutor::Impl::sourceOf(const Graph& graph, const std::string& name) const {
  const auto model = std::find_if(inputs.begin(), inputs.end(), [&](const TensorSlot& s) { return s.name == name; });
  if (model != inputs.end()) return Source{static_cast<size_t>(model - inputs.begin()), nullptr};
  const auto value = graph.findValue(name);
  if (!value || !graph.value(*value).initializer) {
    throw GraphError(fmt::format("staging lost value '{}'", name));  // a bug, not bad input
  }
  return Source{kNotFrom, graph.value(*value).initializer};
}

void DynamicExecutor::Impl::compileRestAfter(Plan& plan, const Graph& after,
                                             const std::vector<std::string>& stage_outputs, const std::string& what,
                                             const CompileOptions& compile_options) {
  std::vector<TensorSlot> rest_inputs;
  std::vector<bool> rest_varying;
  for (ValueId id : after.inputs()) {
    const std::string& name = after.value(id).name;
    const auto output = std::find(stage_outputs.begin(), stage_outputs.end(), name);
    if (output != stage_outputs.end()) {
      plan.rest_from_stage.push_back(static_cast<size_t>(output - stage_outputs.begin()));
      plan.rest_from_model.push_back(kNotFrom);
      rest_varying.push_back(anyVarying());
    } else {
      const Source from = sourceOf(*plan.graph, name);
      if (from.input == kNotFrom) throw GraphError(fmt::format("staging lost value '{}'", name));
      plan.rest_from_stage.push_back(kNotFrom);
      plan.rest_from_model.push_back(from.input);
      rest_varying.push_back(isVarying(from.input));
    }
    rest_inputs.push_back({name, anchorInfo(after.value(id).type)});
  }
  plan.rest_infos.resize(rest_inputs.size());
  plan.rest_data.resize(rest_inputs.size());
  plan.rest = stageModel(what, after, std::move(rest_inputs), outputs, std::move(rest_varying), compile_options);
}

void DynamicExecutor::Impl::compileHostLoop(Plan& plan, LoopStage& stage, const CompileOptions& compile_options,
                                            const std::string& reason) {
  plan.staged_reason = reason;
  const Graph& graph = *plan.graph;
  auto loop = std::make_unique<HostLoopPlan>();
  const std::vector<std::string>& loop_inputs = stage.loop_inputs;
  if (!loop_inputs.empty() && !loop_inputs[0].empty()) loop->trip_count = sourceOf(graph, loop_inputs[0]);
  if (loop_inputs.size() > 1 && !loop_inputs[1].empty()) loop->condition = sourceOf(graph, loop_inputs[1]);
  for (size_t i = 2; i < loop_inputs.size(); ++i) loop->initial.push_back(sourceOf(graph, loop_inputs[i]));
  for (const std::string& name : stage.captures) loop->captures.push_back(sourceOf(graph, name));
  loop->initial_refs.resize(loop->initial.size());
  loop->capture_refs.resize(loop->captures.size());

  const Graph& body = stage.body;
  loop->spec.iteration_info = anchorInfo(body.value(body.inputs().at(0)).type);
  loop->spec.condition_info = anchorInfo(body.value(body.inputs().at(1)).type);
  loop->spec.unchanged = stage.unchanged;
  loop->spec.body_outputs = stage.body_outputs;
  const size_t scans = stage.loop_outputs.size() - stage.unchanged.size();
  for (size_t j = body.outputs().size() - scans; j < body.outputs().size(); ++j) {
    loop->spec.scans.push_back(anchorInfo(body.value(body.outputs()[j]).type));
  }
  // The iteration number, the condition and the carried values change at
  // every iteration; the values read from outside do not.
  std::vector<TensorSlot> body_inputs, body_outputs;
  std::vector<bool> body_varying;
  for (ValueId id : body.inputs()) {
    body_inputs.push_back({body.value(id).name, anchorInfo(body.value(id).type)});
    body_varying.push_back(body_varying.size() < 2 + stage.unchanged.size());
    // Carried values may change shape (inference saw the first iteration).
    if (body_varying.back() && body_varying.size() > 2) body_inputs.back().info.shape.clear();
  }
  for (size_t i = 0; i < loop->captures.size(); ++i) {
    body_varying[2 + stage.unchanged.size() + i] = isVarying(loop->captures[i].input);
  }
  for (ValueId id : body.outputs()) body_outputs.push_back({body.value(id).name, anchorInfo(body.value(id).type)});
  loop->body = stageModel("Loop body", body, std::move(body_inputs), std::move(body_outputs), std::move(body_varying),
                          compile_options);
  compileRestAfter(plan, stage.after, stage.loop_outputs, "after its Loop", compile_options);
  plan.host_loop = std::move(loop);
}

void DynamicExecutor::Impl::compileEagerNode(Plan& plan, NodeStage& stage, const CompileOptions& compile_options,
                                             const std::string& reason) {
  plan.staged_reason = reason;
  auto node = std::make_unique<EagerNodePlan>();
  node->op_type = stage.op_type;
  node->domain = stage.domain;
  node->attributes = stage.attributes;
  node->output_count = stage.outputs.size();
  for (const std::string& name : stage.inputs) {
    node->inputs.push_back(name.empty() ? std::nullopt : std::optional(sourceOf(*plan.graph, name)));
  }
  node->values.resize(node->inputs.size());
  compileRestAfter(plan, stage.after, stage.outputs, "after its " + stage.op_type, compile_options);
  plan.eager_node = std::move(node);
}

void DynamicExecutor::Impl::runHostStagePlan(Plan& plan, std::span<const TensorInfo> infos,
                                             std::span<const std::byte* const> data, const OutputAllocator& allocate,
                                             StepTrace* trace) {
  const auto ref = [&](const Source& from) {
    return from.input != kNotFrom ? TensorRef{infos[from.input], data[from.input]}
                                  : TensorRef{from.constant->info, from.constant->bytes.data()};
  };
  if (plan.host_loop) {
    HostLoopPlan& loop = *plan.host_loop;
    for (size_t i = 0; i < loop.initial.size(); ++i) loop.initial_refs[i] = ref(loop.initial[i]);
    for (size_t i = 0; i < loop.captures.size(); ++i) loop.capture_refs[i] = ref(loop.captures[i]);
    const std::optional<TensorRef> trip_count = loop.trip_count ? std::optional(ref(*loop.trip_count)) : std::nullopt;
    const std::optional<TensorRef> condition = loop.condition ? std::optional(ref(*loop.condition)) : std::nullopt;
    runHostLoop(
        loop.spec, trip_count ? &*trip_count : nullptr, condition ? &*condition : nullptr, loop.initial_refs,
        loop.capture_refs,
        [&](std::span<const TensorInfo> body_infos, std::span<const std::byte* const> body_data,
            const OutputAllocator& body_allocate) { loop.body->runCall(body_infos, body_data, body_allocate, trace); },
        loop.outputs);
    const auto stage_output = [&](size_t k) {
      return specialize::StageOutput{&loop.outputs.at(k).info, loop.outputs.at(k).bytes.data()};
    };
    return runRest(plan, infos, data, stage_output, allocate, trace);
  }
  EagerNodePlan& node = *plan.eager_node;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.inputs[i]) continue;
    const TensorRef value = ref(*node.inputs[i]);
    node.values[i] = node.inputs[i]->constant
                         ? node.inputs[i]->constant
                         : makeConstant(value.info, std::vector<std::byte>(value.data, value.data + value.info.sizeInBytes()));
  }
  try {
    node.outputs = evaluateNode(node.op_type, node.domain, node.attributes, node.output_count, node.values, opsets,
                                compileOptions());
  } catch (const Error& e) {
    throw UsageError(fmt::format("cannot run model '{}' with inputs {}: {}", model_name, signatureString(infos),
                                 e.what()));
  }
  const auto stage_output = [&](size_t k) {
    return specialize::StageOutput{&node.outputs.at(k)->info, node.outputs.at(k)->bytes.data()};
  };
  runRest(plan, infos, data, stage_output, allocate, trace);
}

}  // namespace kiln
