// If, Loop and Scan at run time: the executor runs their sub-programs and
// moves data between the node's tensors and the sub-program's formal
// inputs and outputs. Shapes were all fixed at compile time, so every copy
// has a planned destination and nothing is allocated, however many
// iterations run.
#include <fmt/format.h>

#include <limits>
#include <span>
#include <string>

#include "kiln/error.h"
#include "runtime/program.h"

namespace kiln {
namespace {

uint64_t bytesOf(const TensorView& view) { return view.numElements() * dtypeSize(view.dtype); }

void copyView(ViewMemory& memory, const TensorView& to, const TensorView& from) {
  memory.copy(to.data, from.data, bytesOf(from));
}

// The tensor as [outer, length, inner bytes] around `axis`.
struct AxisSplit {
  uint64_t outer = 1;
  uint64_t length = 1;
  uint64_t inner_bytes = 0;
};

AxisSplit splitAt(const TensorView& view, uint32_t axis) {
  AxisSplit split;
  uint64_t inner = 1;
  for (uint32_t d = 0; d < view.rank; ++d) {
    const auto dim = static_cast<uint64_t>(view.dims[d]);
    if (d < axis) split.outer *= dim;
    else if (d == axis) split.length = dim;
    else inner *= dim;
  }
  split.inner_bytes = inner * dtypeSize(view.dtype);
  return split;
}

// Copies slice `index` along `axis` of `whole` into `slice`, or back: one
// row of inner bytes per outer position.
void copySlice(ViewMemory& memory, const TensorView& whole, uint32_t axis, uint64_t index, const TensorView& slice,
               bool into_slice) {
  const AxisSplit s = splitAt(whole, axis);
  std::byte* in_whole = whole.data + index * s.inner_bytes;
  const uint64_t whole_pitch = s.length * s.inner_bytes;
  if (into_slice) memory.copyRows(slice.data, s.inner_bytes, in_whole, whole_pitch, s.inner_bytes, s.outer);
  else memory.copyRows(in_whole, whole_pitch, slice.data, s.inner_bytes, s.inner_bytes, s.outer);
}

// Checks, at prepare, that each copy between the node's tensors and a
// sub-program's views moves exactly what its destination holds.
struct Sizes {
  const std::string& kernel;
  std::span<const TensorView> views;

  // `node` and sub-program view `index` hold the same bytes.
  void require(const TensorView& node, uint32_t index, const std::string& what) const {
    require(bytesOf(node), bytesOf(views[index]), what);
  }
  void require(uint64_t expected, uint64_t found, const std::string& what) const {
    if (expected != found) {
      throw UsageError(fmt::format("{}: {} has {} bytes where {} are copied (a malformed package)", kernel, what,
                                   found, expected));
    }
  }
  // Sub-program view `index` is one element of `dtype` (a counter or flag).
  void requireScalar(uint32_t index, DType dtype, const std::string& what) const {
    if (views[index].dtype != dtype || views[index].numElements() != 1) {
      throw UsageError(fmt::format("{}: {} must be one {}", kernel, what, dtypeName(dtype)));
    }
  }
  // A node tensor of `length` slices along `axis`, each the bytes of `slice`.
  void requireSlices(const TensorView& whole, uint32_t axis, uint64_t length, uint32_t slice,
                     const std::string& what) const {
    const AxisSplit s = splitAt(whole, axis);
    require(length, s.length, what + "'s length");
    require(bytesOf(views[slice]), s.outer * s.inner_bytes, what + "'s slice");
  }
};

// Loop(M, cond, v...) -> (v..., scans...): body(i, cond, v...) -> (cond, v..., slices...).
void checkLoop(const Sizes& sizes, const ControlFlow& control, const TensorView* in, const TensorView* out,
               const Program& body) {
  const uint32_t carried = control.inputs - 2;
  // An omitted input's view has no dtype (the executor binds none).
  if (in[0].dtype != DType::kUndefined && (in[0].dtype != DType::kI64 || in[0].numElements() != 1)) {
    throw UsageError("Loop: the trip count must be one int64");
  }
  if (in[1].dtype != DType::kUndefined && (in[1].dtype != DType::kBool || in[1].numElements() != 1)) {
    throw UsageError("Loop: the condition must be one bool");
  }
  sizes.requireScalar(body.input_views[0], DType::kI64, "the body's iteration number");
  sizes.requireScalar(body.input_views[1], DType::kBool, "the body's condition input");
  sizes.requireScalar(body.output_views[0], DType::kBool, "the body's condition output");
  for (uint32_t k = 0; k < carried; ++k) {
    const std::string what = fmt::format("carried value {}", k);
    sizes.require(in[2 + k], body.input_views[2 + k], what);
    sizes.require(bytesOf(sizes.views[body.input_views[2 + k]]), bytesOf(sizes.views[body.output_views[1 + k]]),
                  what + " (the body's output)");
    sizes.require(out[k], body.input_views[2 + k], what + " (the node's output)");
  }
  for (uint32_t j = 0; j < control.outputs - carried; ++j) {
    const TensorView& whole = out[carried + j];
    if (whole.rank == 0) throw UsageError(fmt::format("Loop: scan output {} has no iteration axis", j));
    sizes.requireSlices(whole, 0, static_cast<uint64_t>(whole.dims[0]), body.output_views[1 + carried + j],
                        fmt::format("scan output {}", j));
  }
}

// Scan(states..., scanned...) -> (states..., scans...): body(states...,
// slices...) -> (states..., slices...).
void checkScan(const Sizes& sizes, const ControlFlow& control, const TensorView* in, const TensorView* out,
               const Program& body) {
  const uint32_t states = control.inputs - control.scan_inputs;
  const uint64_t length = static_cast<uint64_t>(in[states].dims[control.input_axes[0]]);
  for (uint32_t i = 0; i < states; ++i) {
    const std::string what = fmt::format("state {}", i);
    sizes.require(in[i], body.input_views[i], what);
    sizes.require(bytesOf(sizes.views[body.input_views[i]]), bytesOf(sizes.views[body.output_views[i]]),
                  what + " (the body's output)");
    sizes.require(out[i], body.input_views[i], what + " (the node's output)");
  }
  for (uint32_t k = 0; k < control.scan_inputs; ++k) {
    sizes.requireSlices(in[states + k], control.input_axes[k], length, body.input_views[states + k],
                        fmt::format("scanned input {}", k));
  }
  for (uint32_t j = 0; j < control.outputs - states; ++j) {
    sizes.requireSlices(out[states + j], control.output_axes[j], length, body.output_views[states + j],
                        fmt::format("scan output {}", j));
  }
}

}  // namespace

bool isControlFlowKernel(const std::string& kernel) {
  return kernel == "kiln.If" || kernel == "kiln.Loop" || kernel == "kiln.Scan";
}

std::unique_ptr<ControlFlow> prepareControlFlow(const std::string& kernel, const ParamMap& params,
                                                std::vector<const Program*> programs,
                                                std::span<const TensorView> views, const Step& step) {
  const TensorView* inputs = &views[step.first_input];
  const TensorView* outputs = &views[step.first_output];
  const uint32_t input_count = step.input_count;
  auto control = std::make_unique<ControlFlow>();
  control->programs = std::move(programs);
  const int64_t captured_from = params.getInt("captured_from", input_count);
  const size_t expected_programs = kernel == "kiln.If" ? 2 : 1;
  if (control->programs.size() != expected_programs || captured_from < 0 || captured_from > input_count ||
      step.output_count == 0) {
    throw UsageError(fmt::format("{}: malformed step ({} sub-programs, {} inputs, {} outputs)", kernel,
                                 control->programs.size(), captured_from, step.output_count));
  }
  control->inputs = static_cast<uint32_t>(captured_from);
  control->outputs = step.output_count - 1;  // the workspace comes last
  const Sizes sizes{kernel, views};
  if (kernel == "kiln.If") {
    control->kind = ControlFlow::Kind::kIf;
    if (control->inputs != 1 || inputs[0].dtype != DType::kBool || inputs[0].numElements() != 1) {
      throw UsageError("If: the condition must be one bool");
    }
    for (const Program* branch : control->programs) {
      if (branch->output_views.size() != control->outputs) throw UsageError("If: a branch gives the wrong outputs");
      for (uint32_t i = 0; i < control->outputs; ++i) {
        sizes.require(outputs[i], branch->output_views[i], fmt::format("output {}", i));
      }
    }
  } else if (kernel == "kiln.Loop") {
    control->kind = ControlFlow::Kind::kLoop;
    const Program& body = *control->programs[0];
    if (control->inputs < 2 || body.input_views.size() != control->inputs ||
        body.output_views.size() != 1 + static_cast<size_t>(control->outputs) ||
        control->outputs < control->inputs - 2) {
      throw UsageError("Loop: the body's inputs or outputs do not match the node's");
    }
    checkLoop(sizes, *control, inputs, outputs, body);
  } else {
    control->kind = ControlFlow::Kind::kScan;
    const auto scans = params.getInt("num_scan_inputs", 0);
    // Compared as int64: 2^32 would cast to 0 scanned inputs.
    if (scans < 1 || scans > static_cast<int64_t>(control->inputs)) throw UsageError("Scan: bad num_scan_inputs");
    control->scan_inputs = static_cast<uint32_t>(scans);
    const uint32_t states = control->inputs - control->scan_inputs;
    const uint32_t scan_outputs = control->outputs - states;
    auto axes = [&](const std::string& key, uint32_t count, auto rank_of) {
      const auto values = params.getInts(key, std::vector<int64_t>(count, 0));
      if (values.size() != count) throw UsageError(fmt::format("Scan: {} needs {} values", key, count));
      std::vector<uint32_t> result;
      for (uint32_t i = 0; i < count; ++i) {
        const auto rank = static_cast<int64_t>(rank_of(i));
        const int64_t axis = values[i] < 0 ? values[i] + rank : values[i];
        if (axis < 0 || axis >= rank) throw UsageError(fmt::format("Scan: {} value {} is out of range", key, values[i]));
        result.push_back(static_cast<uint32_t>(axis));
      }
      return result;
    };
    auto flags = [&](const std::string& key, uint32_t count) {
      const auto values = params.getInts(key, std::vector<int64_t>(count, 0));
      if (values.size() != count) throw UsageError(fmt::format("Scan: {} needs {} values", key, count));
      std::vector<uint8_t> result;
      for (int64_t v : values) result.push_back(v != 0 ? 1 : 0);
      return result;
    };
    control->input_axes = axes("scan_input_axes", control->scan_inputs, [&](uint32_t i) { return inputs[states + i].rank; });
    control->input_reverse = flags("scan_input_directions", control->scan_inputs);
    // Output ranks are known from the body's slices plus the scan axis.
    const Program& body = *control->programs[0];
    if (body.input_views.size() != control->inputs || body.output_views.size() != control->outputs ||
        control->outputs < states) {
      throw UsageError("Scan: the body's inputs or outputs do not match the node's");
    }
    control->output_axes = axes("scan_output_axes", scan_outputs, [&](uint32_t j) { return outputs[states + j].rank; });
    control->output_reverse = flags("scan_output_directions", scan_outputs);
    checkScan(sizes, *control, inputs, outputs, body);
  }
  return control;
}

void ProgramRunner::runControlFlow(const Step& step) {
  switch (step.control->kind) {
    case ControlFlow::Kind::kIf: runIf(step); break;
    case ControlFlow::Kind::kLoop: runLoop(step); break;
    case ControlFlow::Kind::kScan: runScan(step); break;
  }
}

void ProgramRunner::runIf(const Step& step) {
  const ControlFlow& control = *step.control;
  uint8_t condition = 0;
  memory_.read(&condition, views_[step.first_input].data, 1);
  const Program& branch = *control.programs[condition != 0 ? 0 : 1];
  run(branch.steps);  // only the chosen branch runs
  for (uint32_t i = 0; i < control.outputs; ++i) {
    copyView(memory_, views_[step.first_output + i], views_[branch.output_views[i]]);
  }
}

// Loop(M, cond, v...): body(i, cond, v...) -> (cond, v..., scan...).
void ProgramRunner::runLoop(const Step& step) {
  const ControlFlow& control = *step.control;
  const Program& body = *control.programs[0];
  const TensorView* in = &views_[step.first_input];
  const TensorView* out = &views_[step.first_output];
  const uint32_t carried = control.inputs - 2;
  int64_t trip_limit = std::numeric_limits<int64_t>::max();
  if (in[0].data != nullptr) memory_.read(&trip_limit, in[0].data, sizeof(trip_limit));
  uint8_t condition = 1;
  if (in[1].data != nullptr) memory_.read(&condition, in[1].data, 1);
  for (uint32_t k = 0; k < carried; ++k) copyView(memory_, views_[body.input_views[2 + k]], in[2 + k]);
  const uint32_t scans = control.outputs - carried;
  int64_t iteration = 0;
  for (; iteration < trip_limit && condition != 0; ++iteration) {
    if (scans > 0 && static_cast<int64_t>(out[carried].dims[0]) <= iteration) break;
    const uint8_t running = 1;
    memory_.write(views_[body.input_views[0]].data, &iteration, sizeof(iteration));
    memory_.write(views_[body.input_views[1]].data, &running, 1);
    run(body.steps);
    // On a device this waits for the body: the next iteration depends on it.
    memory_.read(&condition, views_[body.output_views[0]].data, 1);
    for (uint32_t j = 0; j < scans; ++j) {
      const TensorView& slice = views_[body.output_views[1 + carried + j]];
      memory_.copy(out[carried + j].data + static_cast<uint64_t>(iteration) * bytesOf(slice), slice.data,
                   bytesOf(slice));
    }
    for (uint32_t k = 0; k < carried; ++k) {
      copyView(memory_, views_[body.input_views[2 + k]], views_[body.output_views[1 + k]]);
    }
  }
  if (scans > 0 && iteration != out[carried].dims[0]) {
    throw UsageError(fmt::format("Loop ran {} iterations, but its scan outputs were planned for {} (a loop whose "
                                 "scan outputs' length is only known at run time is not supported)",
                                 iteration, out[carried].dims[0]));
  }
  for (uint32_t k = 0; k < carried; ++k) copyView(memory_, out[k], views_[body.input_views[2 + k]]);
}

// Scan(states..., scanned...): body(states..., slices...) -> (states...,
// scan slices...), once per position along the scanned axis.
void ProgramRunner::runScan(const Step& step) {
  const ControlFlow& control = *step.control;
  const Program& body = *control.programs[0];
  const TensorView* in = &views_[step.first_input];
  const TensorView* out = &views_[step.first_output];
  const uint32_t states = control.inputs - control.scan_inputs;
  const uint32_t scans = control.outputs - states;
  const uint64_t length = static_cast<uint64_t>(in[states].dims[control.input_axes[0]]);
  for (uint32_t i = 0; i < states; ++i) copyView(memory_, views_[body.input_views[i]], in[i]);
  for (uint64_t t = 0; t < length; ++t) {
    for (uint32_t k = 0; k < control.scan_inputs; ++k) {
      const uint64_t index = control.input_reverse[k] ? length - 1 - t : t;
      copySlice(memory_, in[states + k], control.input_axes[k], index, views_[body.input_views[states + k]], true);
    }
    run(body.steps);
    for (uint32_t i = 0; i < states; ++i) copyView(memory_, views_[body.input_views[i]], views_[body.output_views[i]]);
    for (uint32_t j = 0; j < scans; ++j) {
      const uint64_t index = control.output_reverse[j] ? length - 1 - t : t;
      copySlice(memory_, out[states + j], control.output_axes[j], index, views_[body.output_views[states + j]], false);
    }
  }
  for (uint32_t i = 0; i < states; ++i) copyView(memory_, out[i], views_[body.input_views[i]]);
}

}  // namespace kiln
