// Packages crafted to break the runtime (issue 12): each must be refused
// with a clear error before anything runs, never crash or corrupt memory.
// The packages here are real ones, compiled and then rewritten with one
// field changed, the checksums recomputed by the writer: what an attacker
// can make, which the fuzzers' mutations (stopped by the checksums) miss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fmt/format.h>

#include <functional>
#include <utility>
#include <string>

#include "format/executable_spec.h"
#include "kiln/error.h"
#include "kiln/compiler.h"
#include "kiln/executor.h"
#include "kiln/graph.h"
#include "kiln/model_runner.h"
#include "kiln/package_reader.h"
#include "tests/format/package_edit.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln {
namespace {

using testing::TempPackage;

using testing::EditMetadata;
using testing::EditSpec;

// The package at `source` rewritten to `path` with its executable spec
// passed through `edit` (and its metadata through `edit_metadata`).
void rewrite(const std::filesystem::path& source, const std::filesystem::path& path, const EditSpec& edit,
             const EditMetadata& edit_metadata = [](Metadata&) {}) {
  testing::rewritePackage(PackageReader(source), path, edit, edit_metadata);
}

// The affine model's package, edited.
void writeEdited(const std::filesystem::path& path, const EditSpec& edit,
                 const EditMetadata& edit_metadata = [](Metadata&) {}) {
  TempPackage compiled("hostile_source");
  testing::writeAffineModel(compiled.path(), testing::kBatch, testing::kFeatures);
  rewrite(compiled.path(), path, edit, edit_metadata);
}

// The load's error, after checking that `kiln dump --verify`'s verifier
// (verifyModels) refuses the package the same way where it can tell
// without preparing the steps.
std::string loadError(const std::filesystem::path& path) {
  std::string error = "(loaded)";
  try {
    Executor executor(path);
  } catch (const Error& e) {
    error = e.what();
  }
  std::string verified = "(verified)";
  try {
    verifyModels(PackageReader(path), path.string());
  } catch (const Error& e) {
    verified = e.what();
  }
  if (verified != "(verified)") {
    EXPECT_EQ(verified, error);
  }
  return error;
}

// (arena_bytes + 63) / 64 * 64 wrapped to 0 for a size near 2^64: an empty
// block was allocated and the kernels wrote the model's intermediates into it.
TEST(HostilePackage, ArenaSizeNearTwoToTheSixtyFourIsRefused) {
  for (const uint64_t arena : {UINT64_MAX, UINT64_MAX - 62, uint64_t{1} << 62}) {
    TempPackage package("hostile_arena");
    writeEdited(package.path(), [&](ExecutableSpec& spec) { spec.arena_bytes = arena; });
    EXPECT_NE(loadError(package.path()).find("cannot be allocated on this machine"), std::string::npos)
        << arena << ": " << loadError(package.path());
  }
}

// An anchor shrunk below the executable's value (y as [1, 1] of a [4, 8]
// output) passed `kiln dump --verify`, and the runs wrote the whole output
// into the caller's 4-byte block. Likewise an input anchor larger or smaller
// than the value the steps read.
TEST(HostilePackage, AnchorsThatDisagreeWithTheExecutableAreRefused) {
  for (const char* name : {"y", "x"}) {
    TempPackage package("hostile_anchor");
    writeEdited(
        package.path(), [](ExecutableSpec&) {},
        [&](Metadata& metadata) {
          for (Anchor& anchor : metadata.anchors) {
            if (anchor.name == name) anchor.info.shape = {1, 1};
          }
        });
    const std::string error = loadError(package.path());
    EXPECT_NE(error.find(fmt::format("anchor '{}' is", name)), std::string::npos) << error;
    EXPECT_NE(error.find("but the executable's value is"), std::string::npos) << error;
    // A device loads through Executable, which checks the same.
    DeviceManager manager(testing::simOptions(1));
    ModelRunnerConfig config;
    config.device_kind = DeviceKind::kSim;
    config.device_manager = &manager;
    std::string on_sim = "(loaded)";
    try {
      ModelRunner runner(package.path(), config);
    } catch (const Error& e) {
      on_sim = e.what();
    }
    EXPECT_NE(on_sim.find("but the executable's value is"), std::string::npos) << on_sim;
  }
}

// The executable was trusted not to write where it must not: a step whose
// output lies in a constant (a read-only mapping of the file) or in a model
// input (the caller's buffer, immutable `bytes` in Python).
TEST(HostilePackage, StepsWritingIntoConstantsOrInputsAreRefused) {
  for (const ValueStorage target : {ValueStorage::kConstant, ValueStorage::kInput}) {
    TempPackage package("hostile_write");
    writeEdited(package.path(), [&](ExecutableSpec& spec) {
      for (uint32_t i = 0; i < spec.values.size(); ++i) {
        if (spec.values[i].storage == target) spec.steps.front().outputs.front() = i;
      }
    });
    const std::string error = loadError(package.path());
    EXPECT_NE(error.find(target == ValueStorage::kConstant ? "which lies in a constant" : "which lies in a model input"),
              std::string::npos)
        << error;
  }
}

// A fused elementwise step may write a training update straight over its
// variable, but only the whole constant: writing through an alias into part
// of one is refused like any other step's write.
TEST(HostilePackage, AnElementwiseStepWritingPartOfAConstantIsRefused) {
  TempPackage package("hostile_partial_write");
  writeEdited(package.path(), [&](ExecutableSpec& spec) {
    for (uint32_t i = 0; i < spec.values.size(); ++i) {
      if (spec.values[i].storage != ValueStorage::kConstant) continue;
      ValueSpec part{spec.values[i].name + ":part", TensorInfo{DType::kF32, {1}}, ValueStorage::kAlias, 4, i};
      spec.values.push_back(part);
      spec.steps.front().kernel = "kiln.FusedElementwise";
      spec.steps.front().outputs = {static_cast<uint32_t>(spec.values.size() - 1)};
      return;
    }
  });
  const std::string error = loadError(package.path());
  EXPECT_NE(error.find("which lies in a constant"), std::string::npos) << error;
}

// Control flow copied bytesOf(source) into its destination unchecked: a
// sub-program whose formal input or output lists name a value of another
// size made the copies write past their destination (a carried [4] float
// value into a 1-byte flag) or read past their source.
TEST(HostilePackage, ControlFlowCopiesThatDoNotFitAreRefused) {
  TempPackage loop("hostile_loop_source"), conditional("hostile_if_source");
  testing::writeLoopModel(loop.path());
  testing::writeConditionalModel(conditional.path());
  // The sub-program the step of `kernel` runs first (Loop: its body; If:
  // its then branch), and the step.
  auto find = [](ExecutableSpec& spec, const char* kernel) -> std::pair<SubProgramSpec*, StepSpec*> {
    for (StepSpec& step : spec.steps) {
      if (step.kernel == kernel) return {&spec.subprograms.at(step.subprograms.front()), &step};
    }
    ADD_FAILURE() << "no " << kernel << " step";
    return {nullptr, nullptr};
  };
  struct Case {
    const std::filesystem::path* source;
    EditSpec edit;
    const char* expected;
  };
  const Case cases[] = {
      // The body's carried input replaced by its 1-byte condition input.
      {&loop.path(),
       [&](ExecutableSpec& spec) {
         auto [body, step] = find(spec, "kiln.Loop");
         body->inputs[2] = body->inputs[1];
       },
       "carried value 0 has 1 bytes where 16 are copied"},
      // The body's scan slice replaced by its 8-byte iteration number.
      {&loop.path(),
       [&](ExecutableSpec& spec) {
         auto [body, step] = find(spec, "kiln.Loop");
         body->outputs[2] = body->inputs[0];
       },
       "scan output 0's slice"},
      // The then branch's output replaced by the 1-byte condition.
      {&conditional.path(),
       [&](ExecutableSpec& spec) {
         auto [branch, step] = find(spec, "kiln.If");
         branch->outputs[0] = step->inputs[0];
       },
       "output 0 has 1 bytes where 16 are copied"},
  };
  for (const Case& c : cases) {
    TempPackage package("hostile_control_flow");
    rewrite(*c.source, package.path(), c.edit);
    const std::string error = loadError(package.path());
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.expected << ": " << error;
  }
}

// A control-flow step without outputs (its workspace comes last) made the
// output count wrap to 2^32 - 1.
TEST(HostilePackage, AControlFlowStepWithoutOutputsIsRefused) {
  TempPackage loop("hostile_loop_source"), package("hostile_loop_outputs");
  testing::writeLoopModel(loop.path());
  rewrite(loop.path(), package.path(), [](ExecutableSpec& spec) {
    for (StepSpec& step : spec.steps) {
      if (step.kernel == "kiln.Loop") step.outputs.clear();
    }
  });
  const std::string error = loadError(package.path());
  EXPECT_NE(error.find("malformed step"), std::string::npos) << error;
}

// A Scan step whose num_scan_inputs is 2^32 cast to 0 scanned inputs, and
// the check of their axes read an empty list (package_fuzz).
TEST(HostilePackage, AScanOfTwoToTheThirtyTwoScannedInputsIsRefused) {
  // A running sum: s = s + x_t over the rows of xs [3, 4], each row's sum
  // stacked into ys.
  auto body = std::make_shared<Graph>("body");
  const ValueId s_in = body->addInput("s_in", ValueType::tensor(DType::kF32, {4}));
  const ValueId x_t = body->addInput("x_t", ValueType::tensor(DType::kF32, {4}));
  const ValueId s_out = body->node(body->addNode("Add", {s_in, x_t}, {"s_out"})).outputs[0];
  body->addOutput(s_out);
  body->addOutput(body->node(body->addNode("Identity", {s_out}, {"y_t"})).outputs[0]);
  Graph graph;
  const ValueId s0 = graph.addInput("s0", ValueType::tensor(DType::kF32, {4}));
  const ValueId xs = graph.addInput("xs", ValueType::tensor(DType::kF32, {3, 4}));
  const NodeId scan = graph.addNode("Scan", {s0, xs}, {"s", "ys"},
                                    {{"body", GraphPtr(body)}, {"num_scan_inputs", int64_t{1}}});
  graph.addOutput(graph.node(scan).outputs[0]);
  graph.addOutput(graph.node(scan).outputs[1]);
  TempPackage source("hostile_scan_source"), package("hostile_scan");
  compile(graph, {{"", 17}}, source.path());
  rewrite(source.path(), package.path(), [](ExecutableSpec& spec) {
    for (StepSpec& step : spec.steps) {
      if (step.kernel == "kiln.Scan") step.params.set("num_scan_inputs", int64_t{1} << 32);
    }
  });
  const std::string error = loadError(package.path());
  EXPECT_NE(error.find("Scan: bad num_scan_inputs"), std::string::npos) << error;
}

// Found by package_fuzz, whose structural mutations reach past the
// checksums: each crafted executable ran and read or wrote where it must
// not (or tripped UBSan) before the verifier refused it.
TEST(HostilePackage, ExecutablesTheFuzzerCraftedAreRefused) {
  constexpr uint32_t kNoValue = kNoValueIndex;
  // A value appended to the executable, in the arena unless said otherwise.
  auto append = [](ExecutableSpec& spec, const std::string& name, std::vector<int64_t> shape,
                   ValueStorage storage = ValueStorage::kArena, uint64_t offset = 0, uint32_t index = 0) {
    spec.values.push_back({name, TensorInfo{DType::kF32, std::move(shape)}, storage, offset, index});
    spec.arena_bytes = std::max<uint64_t>(spec.arena_bytes, 1024);
    return static_cast<uint32_t>(spec.values.size() - 1);
  };
  auto relu = [](uint32_t input, uint32_t output) { return StepSpec{"Relu", {input}, {output}, {}, {}}; };
  struct Case {
    const char* what;
    EditSpec edit;
    const char* expected;
  };
  const Case cases[] = {
      // A step writing over what it reads: memcpy of overlapping ranges.
      {"output over its input",
       [&](ExecutableSpec& spec) {
         const uint32_t t = append(spec, "t", {4, 8});
         spec.steps.push_back(relu(t, t));
       },
       "step 'Relu' writes value 't' over value 't', which it also reads"},
      // An omitted output: the executor indexed its value table with 2^32 - 1.
      {"omitted output",
       [&](ExecutableSpec& spec) { spec.steps.push_back(relu(spec.inputs[0], kNoValue)); },
       "step 'Relu' refers to value 4294967295"},
      // A float at byte 2 of the arena: misaligned loads and stores.
      {"misaligned value",
       [&](ExecutableSpec& spec) { append(spec, "t", {2}, ValueStorage::kArena, 2); },
       "value 't' starts at byte 2 of its storage, not on a 4-byte element boundary"},
      // A second, larger value in the caller's input buffer: read past it.
      {"second value in an input",
       [&](ExecutableSpec& spec) { append(spec, "x2", {64, 64}, ValueStorage::kInput, 0, 0); },
       "value 'x2' claims input 0, which is not its value"},
      // The input value renamed and grown: anchors were matched by name, so
      // none was checked, and the steps read past the caller's buffer.
      {"renamed input",
       [&](ExecutableSpec& spec) {
         ValueSpec& x = spec.values[spec.inputs[0]];
         x.name = "renamed";
         x.info.shape = {64, 64};
       },
       "anchor 'x' is { dtype: F32, sizeInBytes: 128, shape [4, 8] } but the executable's value is { dtype: F32, "
       "sizeInBytes: 16384, shape [64, 64] }"},
  };
  for (const Case& c : cases) {
    TempPackage package("hostile_crafted");
    writeEdited(package.path(), c.edit);
    const std::string error = loadError(package.path());
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.what << ": " << error;
  }
}

// An empty tensor's buffer may be null (an empty vector's data()); memcpy
// was handed it (UBSan, found by graph_run_fuzz). A null buffer for a
// tensor with elements is a clear error.
TEST(HostileRequest, NullBuffersAreServedForEmptyTensorsOnly) {
  TempPackage empty("empty_input"), full("full_input");
  for (const auto& [package, rows] : {std::pair{&empty, int64_t{0}}, std::pair{&full, int64_t{2}}}) {
    Graph graph;
    const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {rows, 4}));
    graph.addOutput(graph.node(graph.addNode("Relu", {x}, {"y"})).outputs[0]);
    compile(graph, {{"", 17}}, package->path());
  }
  const std::byte* no_input[] = {nullptr};
  std::byte* no_output[] = {nullptr};
  Executor(empty.path()).run(no_input, no_output);
  try {
    Executor(full.path()).run(no_input, no_output);
    ADD_FAILURE() << "a null buffer for 8 floats was accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "run(): input 0 is a null pointer");
  }
}

}  // namespace
}  // namespace kiln
