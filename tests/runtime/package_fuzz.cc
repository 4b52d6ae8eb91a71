// libFuzzer target for loading and running packages (issue 12): any bytes
// in, and the package reader, the load-time verifier, the executable's
// setup on the cpu device (each step's prepare, the control-flow copy
// checks, the arena) and one run of the main program with zeroed inputs
// either refuse them with a kiln::Error or run; never a crash, a read or
// write outside a buffer (the sanitizers check), or another exception.
//
// Whole-file mutations mostly stop at a checksum, so this target reads the
// package with checksums skipped, and half of its mutations are structural
// (LLVMFuzzerCustomMutator): the executable is decoded, one field changed
// to a value of its kind (another value's index, a nearby offset, a
// dimension, a storage class, another step's kernel, an anchor's shape),
// and the package written again by PackageWriter (tests/format/
// package_edit.h). Seeds: tests/runtime/package_fuzz_seeds, made by
// make_package_fuzz_seeds.py.
//
// What docs/security.md does not promise is not run: a package whose arena
// or values exceed a few pages, or one with a Loop (it may iterate as long
// as its trip count says), is loaded, which prepares every step, but its
// main program is not run.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "format/executable_spec.h"
#include "kiln/device.h"
#include "kiln/error.h"
#include "kiln/executable.h"
#include "kiln/log.h"
#include "kiln/package_reader.h"
#include "kiln/session.h"
#include "tests/format/package_edit.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using namespace kiln;

constexpr uint64_t kMaxArenaBytesToLoad = 64u << 20;
constexpr uint64_t kMaxArenaBytesToRun = 1u << 20;
constexpr uint64_t kMaxValueBytesToRun = 64u << 10;  // bounds a MatMul's or a Conv's work

PackageReader readUnchecked(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  return PackageReader::fromMemory({{"fuzz.kiln", bytes}}, {.checksums = ChecksumPolicy::kSkip});
}

// One cpu device for the process (a device is attached once).
std::shared_ptr<Device> cpuDevice() {
  static DeviceManager manager{DeviceManagerOptions{}};
  static const std::shared_ptr<Device> device = manager.getSpecificDevice("cpu");
  return device;
}

// Whether the main program may run within the bounds above.
bool boundedToRun(const ExecutableSpec& spec) {
  if (spec.arena_bytes > kMaxArenaBytesToRun) return false;
  for (const ValueSpec& value : spec.values) {
    if (!value.info.isStatic() || value.info.sizeInBytes() > kMaxValueBytesToRun) return false;
  }
  auto hasLoop = [](const std::vector<StepSpec>& steps) {
    for (const StepSpec& step : steps) {
      if (step.kernel == "kiln.Loop") return true;
    }
    return false;
  };
  if (hasLoop(spec.steps)) return false;
  for (const SubProgramSpec& sub : spec.subprograms) {
    if (hasLoop(sub.steps)) return false;
  }
  return true;
}

void loadAndRun(const uint8_t* data, size_t size) {
  auto reader = std::make_shared<const PackageReader>(readUnchecked(data, size));
  verifyModels(*reader, "fuzz.kiln");
  if (reader->metadata().size() != 1) return;
  const Metadata& metadata = reader->metadata().front()->metadata();
  const ExecutableBlob* blob = reader->findExecutable(metadata.executable);
  if (blob == nullptr || blob->size() > (1u << 20)) return;
  ExecutableSpec spec;
  try {
    spec = decodeExecutable(blob->read(), "fuzz.kiln");
  } catch (const FormatError&) {
    return;  // a graph package: its graph is the graph codec target's
  }
  if (spec.arena_bytes > kMaxArenaBytesToLoad) return;
  Session session(reader, cpuDevice(), SessionOptions{.executable = {.threads = 1}, .pipeline_depth = 1});
  session.runLoadPrograms();
  if (!boundedToRun(spec)) return;
  Executable& executable = session.executable();
  std::vector<std::vector<std::byte>> buffers;
  std::vector<const std::byte*> inputs;
  std::vector<std::byte*> outputs;
  for (const Anchor& anchor : executable.mainInputs()) {
    if (!anchor.info.isStatic() || anchor.info.sizeInBytes() > kMaxValueBytesToRun) return;
    buffers.emplace_back(anchor.info.sizeInBytes() + 1);  // never empty: a real address
    inputs.push_back(buffers.back().data());
  }
  for (const Anchor& anchor : executable.mainOutputs()) {
    if (!anchor.info.isStatic() || anchor.info.sizeInBytes() > kMaxValueBytesToRun) return;
    buffers.emplace_back(anchor.info.sizeInBytes() + 1);
    outputs.push_back(buffers.back().data());
  }
  executable.runMain(inputs, outputs);
}

// ------------------------------------------------- structural mutations

// Picks one field of the executable (or an anchor) and changes it to a
// value of its kind, so that the package still decodes and the edit reaches
// the verifier, the steps' prepare or the kernels.
class StructuralEdit {
 public:
  explicit StructuralEdit(unsigned seed) : rng_(seed), kind_(pick(12)) {}

  void edit(ExecutableSpec& spec) {
    const uint32_t values = static_cast<uint32_t>(spec.values.size());
    std::vector<StepSpec*> steps;
    for (StepSpec& step : spec.steps) steps.push_back(&step);
    for (SubProgramSpec& sub : spec.subprograms) {
      for (StepSpec& step : sub.steps) steps.push_back(&step);
    }
    ValueSpec* value = values == 0 ? nullptr : &spec.values[pick(values)];
    StepSpec* step = steps.empty() ? nullptr : steps[pick(steps.size())];
    switch (kind_) {
      case 0:
        if (value && !value->info.shape.empty()) mutateDim(value->info.shape[pick(value->info.shape.size())]);
        break;
      case 1:
        if (value) value->info.dtype = static_cast<DType>(pick(16));
        break;
      case 2:
        if (value) value->storage = static_cast<ValueStorage>(pick(5));
        break;
      case 3:
        if (value) value->offset = nearby(value->offset, spec.arena_bytes);
        break;
      case 4:
        if (value) value->index = static_cast<uint32_t>(pick(values + 2));
        break;
      case 5:
        if (step && !step->inputs.empty()) step->inputs[pick(step->inputs.size())] = anyValue(values);
        break;
      case 6:
        if (step && !step->outputs.empty()) step->outputs[pick(step->outputs.size())] = anyValue(values);
        break;
      case 7:
        if (step && !steps.empty()) step->kernel = steps[pick(steps.size())]->kernel;
        break;
      case 8:
        spec.arena_bytes = nearby(spec.arena_bytes, spec.arena_bytes);
        break;
      case 9:
        if (!spec.subprograms.empty()) {
          SubProgramSpec& sub = spec.subprograms[pick(spec.subprograms.size())];
          std::vector<uint32_t>& list = pick(2) == 0 ? sub.inputs : sub.outputs;
          if (!list.empty()) list[pick(list.size())] = anyValue(values);
        }
        break;
      case 10:
        if (step && !step->subprograms.empty()) step->subprograms[pick(step->subprograms.size())] = pick(4);
        break;
      default: {
        std::vector<uint32_t>& list = pick(2) == 0 ? spec.inputs : spec.outputs;
        if (!list.empty()) list[pick(list.size())] = anyValue(values);
      }
    }
  }

  // Anchors change in one mutation of twelve (kind 11 also edits the
  // executable's input and output lists).
  void edit(Metadata& metadata) {
    if (kind_ != 11 || metadata.anchors.empty()) return;
    Anchor& anchor = metadata.anchors[pick(metadata.anchors.size())];
    if (!anchor.info.shape.empty()) mutateDim(anchor.info.shape[pick(anchor.info.shape.size())]);
  }

 private:
  size_t pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  uint32_t anyValue(uint32_t values) {
    return pick(16) == 0 ? kNoValueIndex : static_cast<uint32_t>(pick(values + 1));
  }

  void mutateDim(int64_t& dim) {
    static constexpr int64_t kSpecial[] = {0, 1, 2, -1, int64_t{1} << 31, int64_t{1} << 62, INT64_MAX};
    switch (pick(3)) {
      case 0: dim = kSpecial[pick(std::size(kSpecial))]; break;
      case 1: dim += 1; break;
      default: dim = dim > 0 ? dim - 1 : dim * 2;
    }
  }

  uint64_t nearby(uint64_t at, uint64_t range) {
    static constexpr uint64_t kSpecial[] = {0, 1, 63, 64, UINT64_MAX, UINT64_MAX - 63, uint64_t{1} << 62};
    switch (pick(4)) {
      case 0: return kSpecial[pick(std::size(kSpecial))];
      case 1: return at + 4 * (pick(33) - 16);
      case 2: return range == 0 ? 0 : static_cast<uint64_t>(rng_()) % range;
      default: return at / 2;
    }
  }

  std::minstd_rand rng_;
  size_t kind_;
};

std::filesystem::path scratchPath() {
  const std::filesystem::path dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  return dir / ("kiln_package_fuzz_" + std::to_string(::getpid()) + ".kiln");
}

// The package of `data` with one structural edit, or an empty vector when
// it does not decode that far.
std::vector<uint8_t> structurallyMutated(const uint8_t* data, size_t size, unsigned seed) {
  static const std::filesystem::path path = scratchPath();
  try {
    const PackageReader reader = readUnchecked(data, size);
    StructuralEdit edit(seed);
    testing::rewritePackage(
        reader, path, [&](ExecutableSpec& spec) { edit.edit(spec); }, [&](Metadata& m) { edit.edit(m); });
  } catch (const Error&) {
    return {};
  }
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  if (seed % 2 == 0) {
    const std::vector<uint8_t> mutated = structurallyMutated(data, size, seed / 2);
    if (!mutated.empty() && mutated.size() <= max_size) {
      std::memcpy(data, mutated.data(), mutated.size());
      return mutated.size();
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    setLogLevel(LogLevel::kOff);
    return true;
  }();
  (void)quiet;
  try {
    loadAndRun(data, size);
  } catch (const Error&) {
    // Refusing a malformed package, or a step's clear error, is the expected outcome.
  }
  return 0;
}
