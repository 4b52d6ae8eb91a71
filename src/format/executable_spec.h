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
// Encoding: u32 version, u64 arena_bytes, list<string> constants,
// list<u32> inputs, list<u32> outputs, list<Value>, list<Step>, where
// Value = string name, TensorInfo, u8 storage, u64 offset, u32 index and
// Step = string kernel, list<u32> inputs (0xFFFFFFFF: omitted), list<u32>
// outputs, ParamMap params. docs/format.md gives the primitives.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/param_map.h"
#include "kiln/tensor_info.h"

namespace kiln {

inline constexpr uint32_t kExecutableVersion = 1;
inline constexpr uint32_t kNoValueIndex = 0xFFFFFFFFu;

enum class ValueStorage : uint8_t { kArena = 0, kConstant = 1, kInput = 2, kOutput = 3, kAlias = 4 };

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
  friend bool operator==(const StepSpec&, const StepSpec&) = default;
};

struct ExecutableSpec {
  uint64_t arena_bytes = 0;
  std::vector<std::string> constants;
  std::vector<uint32_t> inputs;   // value index of each model input, in anchor order
  std::vector<uint32_t> outputs;  // value index of each model output
  std::vector<ValueSpec> values;
  std::vector<StepSpec> steps;    // the main program
  friend bool operator==(const ExecutableSpec&, const ExecutableSpec&) = default;
};

std::vector<std::byte> encodeExecutable(const ExecutableSpec& spec);

// Decodes and validates (indices in range, aliases acyclic and inside their
// base, arena values inside the arena); throws FormatError naming `source`.
ExecutableSpec decodeExecutable(std::span<const std::byte> bytes, const std::string& source);

}  // namespace kiln
