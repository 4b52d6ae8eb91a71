// ExecutableSpec: the contents of a CPU Executable blob, written by the
// compiler and read by the runtime.
//
// A program is a flat list of steps; each step runs one kernel (by name)
// over values. Every value is a static-shaped tensor stored in one of:
//   kArena     the shared intermediate arena, at `offset`
//   kConstant  TensorData blob `constants[index]`, used in place
//   kInput     the caller's buffer for input `index`
//   kOutput    the caller's (or runner's) buffer for output `index`
//   kAlias     the memory of value `index`, `offset` bytes in (views:
//              Reshape, Flatten, Squeeze, Unsqueeze share their input)
//
// Control flow (If, Loop, Scan) runs sub-programs: a step whose kernel is
// kiln.If / kiln.Loop / kiln.Scan names them in `subprograms` (If: then,
// else; Loop and Scan: body), and the executor runs them itself. A
// sub-program has formal inputs (arena values the executor fills before it
// runs: a body's iteration number, condition, carried values, slices),
// steps and outputs (any values, read after it ran). Sub-programs share the
// executable's value table; their arena values lie in the workspace of the
// control-flow step that runs them (its last output), inside the parent's
// arena, so running them allocates nothing. A control-flow step's inputs
// are the node's inputs, then the outer values its sub-programs read
// (param `captured_from` is where those start), to keep them alive.
//
// Encoding: u32 version, u64 arena_bytes, list<string> constants,
// list<u32> inputs, list<u32> outputs, list<Value>, list<Step>,
// list<SubProgram> (version 2), where Value = string name, TensorInfo, u8
// storage, u64 offset, u32 index; Step = string kernel, list<u32> inputs
// (0xFFFFFFFF: omitted), list<u32> outputs, ParamMap params, list<u32>
// subprograms (version 2); SubProgram = list<u32> inputs, list<u32>
// outputs, list<Step>. A sub-program's steps name only sub-programs listed
// before it. docs/format.md gives the primitives. Version 1 (no control
// flow) is still read.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/param_map.h"
#include "kiln/tensor_info.h"

namespace kiln {

inline constexpr uint32_t kExecutableVersion = 2;
inline constexpr uint32_t kNoValueIndex = 0xFFFFFFFFu;

enum class ValueStorage : uint8_t { kArena = 0, kConstant = 1, kInput = 2, kOutput = 3, kAlias = 4 };

// Whether memory of `storage` other than the arena lies as a plugin's
// allocator hook asks (`alignment` a power of two, `padding` readable bytes
// past the end) without being planned for it: a constant is 64-byte
// aligned, a caller's buffer only element-aligned, and neither has padding.
// The arena holds any layout the planner was given. The compiler copies an
// input that does not hold into the arena; the verifier refuses a package
// that skipped the copy.
inline bool storageHoldsLayout(ValueStorage storage, uint64_t element_bytes, uint64_t alignment, uint64_t padding) {
  if (storage == ValueStorage::kArena) return true;
  if (padding > 0) return false;
  return alignment <= (storage == ValueStorage::kConstant ? 64 : element_bytes);
}

struct ValueSpec {
  std::string name;
  TensorInfo info;
  ValueStorage storage = ValueStorage::kArena;
  uint64_t offset = 0;
  uint32_t index = 0;
  friend bool operator==(const ValueSpec&, const ValueSpec&) = default;
};

struct StepSpec {
  std::string kernel;
  std::vector<uint32_t> inputs;
  std::vector<uint32_t> outputs;
  ParamMap params;
  std::vector<uint32_t> subprograms;  // for control-flow steps
  friend bool operator==(const StepSpec&, const StepSpec&) = default;
};

struct SubProgramSpec {
  std::vector<uint32_t> inputs;   // formal inputs: arena values filled by the executor
  std::vector<uint32_t> outputs;
  std::vector<StepSpec> steps;
  friend bool operator==(const SubProgramSpec&, const SubProgramSpec&) = default;
};

struct ExecutableSpec {
  uint64_t arena_bytes = 0;
  std::vector<std::string> constants;
  std::vector<uint32_t> inputs;   // value index of each model input, in anchor order
  std::vector<uint32_t> outputs;  // value index of each model output
  std::vector<ValueSpec> values;
  std::vector<StepSpec> steps;    // the main program
  std::vector<SubProgramSpec> subprograms;
  friend bool operator==(const ExecutableSpec&, const ExecutableSpec&) = default;
};

std::vector<std::byte> encodeExecutable(const ExecutableSpec& spec);

struct Metadata;

// The constants a program writes: the variables its kiln.Assign steps
// replace, and those an elementwise step updates in place (a training
// update written straight over its variable). The runtimes give them
// writable memory, and no kernel may treat them as constant (pack them at
// prepare time). The verifier lets a step write a constant only whole (a
// value stored as the constant itself, not an alias into it): kiln.Assign
// from a value of the same size, kiln.FusedElementwise as its output.
std::set<std::string> writtenConstants(const ExecutableSpec& spec);

// Callers size their memory by a model's anchors while the steps write (or
// read) the executable's values: throws FormatError naming `source` (at
// byte `offset`) unless the output anchors and the main program's input
// anchors (Metadata::mainInputs) are, in order, the executable's outputs
// and inputs, each static and of its value's dtype and byte size. Load runs
// it, and `kiln dump --verify`.
void checkAnchorsMatch(const Metadata& metadata, const ExecutableSpec& spec, const std::string& source,
                       uint64_t offset);

class PackageReader;

// What loading checks before anything runs, for every model of `reader`:
// its executable decoded (decodeExecutable's checks) and its anchors
// matched (checkAnchorsMatch). A graph package's executable (a graph) is
// checked when it is specialized. `kiln dump --verify` runs it.
void verifyModels(const PackageReader& reader, const std::string& source);

// Decodes and validates (indices in range, aliases acyclic and inside their
// base, arena values inside the arena); throws FormatError naming `source`.
ExecutableSpec decodeExecutable(std::span<const std::byte> bytes, const std::string& source);

}  // namespace kiln
