#include "format/executable_spec.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "format/info_codec.h"
#include "format/graph_package.h"
#include "kiln/metadata.h"
#include "kiln/package_reader.h"
#include "kiln/plugin.h"

namespace kiln {
namespace {

void encodeIndices(ByteWriter& out, const std::vector<uint32_t>& list) {
  out.u32(static_cast<uint32_t>(list.size()));
  for (uint32_t v : list) out.u32(v);
}

std::vector<uint32_t> decodeIndices(ByteCursor& in, std::string_view field) {
  std::vector<uint32_t> list(in.count(field, 4));
  for (uint32_t& v : list) v = in.u32(field);
  return list;
}

void encodeSteps(ByteWriter& out, const std::vector<StepSpec>& steps) {
  out.u32(static_cast<uint32_t>(steps.size()));
  for (const StepSpec& step : steps) {
    out.string(step.kernel);
    encodeIndices(out, step.inputs);
    encodeIndices(out, step.outputs);
    step.params.encode(out);
    encodeIndices(out, step.subprograms);
  }
}

std::vector<StepSpec> decodeSteps(ByteCursor& in, uint32_t version) {
  std::vector<StepSpec> result;
  const uint32_t steps = in.count("steps", 4 + 4 + 4 + 4);
  for (uint32_t i = 0; i < steps; ++i) {
    StepSpec step;
    step.kernel = in.string("kernel");
    step.inputs = decodeIndices(in, "step inputs");
    step.outputs = decodeIndices(in, "step outputs");
    step.params = ParamMap::decode(in);
    if (version >= 2) step.subprograms = decodeIndices(in, "step subprograms");
    result.push_back(std::move(step));
  }
  return result;
}

}  // namespace

std::vector<std::byte> encodeExecutable(const ExecutableSpec& spec) {
  ByteWriter out;
  out.u32(kExecutableVersion);
  out.u64(spec.arena_bytes);
  out.u32(static_cast<uint32_t>(spec.constants.size()));
  for (const std::string& name : spec.constants) out.string(name);
  encodeIndices(out, spec.inputs);
  encodeIndices(out, spec.outputs);
  out.u32(static_cast<uint32_t>(spec.values.size()));
  for (const ValueSpec& v : spec.values) {
    out.string(v.name);
    encodeTensorInfo(out, v.info);
    out.u8(static_cast<uint8_t>(v.storage));
    out.u64(v.offset);
    out.u32(v.index);
  }
  encodeSteps(out, spec.steps);
  out.u32(static_cast<uint32_t>(spec.subprograms.size()));
  for (const SubProgramSpec& program : spec.subprograms) {
    encodeIndices(out, program.inputs);
    encodeIndices(out, program.outputs);
    encodeSteps(out, program.steps);
  }
  return out.take();
}

ExecutableSpec decodeExecutable(std::span<const std::byte> bytes, const std::string& source) {
  ByteCursor in(bytes, source, 0);
  const uint32_t version = in.u32("executable version");
  if (version != 1 && version != kExecutableVersion) {
    in.failAt(0, fmt::format("executable version {} is not the version this runtime runs ({}): recompile the model "
                             "with this kiln",
                             version, kExecutableVersion));
  }
  ExecutableSpec spec;
  spec.arena_bytes = in.u64("arena_bytes");
  const uint32_t constants = in.count("constants", 4);
  for (uint32_t i = 0; i < constants; ++i) spec.constants.push_back(in.string("constant name"));
  spec.inputs = decodeIndices(in, "inputs");
  spec.outputs = decodeIndices(in, "outputs");
  const uint32_t values = in.count("values", 4 + 5 + 1 + 8 + 4);
  for (uint32_t i = 0; i < values; ++i) {
    ValueSpec v;
    v.name = in.string("value name");
    v.info = decodeTensorInfo(in);
    const uint64_t storage_at = in.offset();
    const uint8_t storage = in.u8("storage");
    if (storage > static_cast<uint8_t>(ValueStorage::kAlias)) in.failAt(storage_at, "unknown value storage");
    v.storage = static_cast<ValueStorage>(storage);
    v.offset = in.u64("offset");
    v.index = in.u32("index");
    if (!v.info.isStatic()) in.failAt(storage_at, fmt::format("value '{}' has a dynamic shape", v.name));
    spec.values.push_back(std::move(v));
  }
  spec.steps = decodeSteps(in, version);
  if (version >= 2) {
    const uint32_t subprograms = in.count("subprograms", 12);
    for (uint32_t i = 0; i < subprograms; ++i) {
      SubProgramSpec program;
      program.inputs = decodeIndices(in, "subprogram inputs");
      program.outputs = decodeIndices(in, "subprogram outputs");
      program.steps = decodeSteps(in, version);
      spec.subprograms.push_back(std::move(program));
    }
  }
  if (in.remaining() != 0) in.fail(fmt::format("{} unexpected trailing bytes", in.remaining()));

  // Every reference in range; arena values inside the arena; aliases point
  // backwards (to an earlier value), so that chains end and cannot loop.
  auto fail = [&](const std::string& problem) { throw FormatError(source, 0, "executable: " + problem); };
  const auto value_count = static_cast<uint32_t>(spec.values.size());
  for (uint32_t index : spec.inputs) {
    if (index >= value_count) fail(fmt::format("input refers to value {} of {}", index, value_count));
  }
  for (uint32_t index : spec.outputs) {
    if (index >= value_count) fail(fmt::format("output refers to value {} of {}", index, value_count));
  }
  for (uint32_t i = 0; i < value_count; ++i) {
    const ValueSpec& v = spec.values[i];
    const uint64_t size = v.info.sizeInBytes();
    switch (v.storage) {
      case ValueStorage::kArena:
        if (v.offset > spec.arena_bytes || size > spec.arena_bytes - v.offset) {
          fail(fmt::format("value '{}' ({} bytes at {}) lies outside the {}-byte arena", v.name, size, v.offset,
                           spec.arena_bytes));
        }
        break;
      case ValueStorage::kConstant:
        if (v.index >= spec.constants.size()) fail(fmt::format("value '{}' refers to constant {}", v.name, v.index));
        break;
      // The caller's buffer i is sized for the value spec.inputs[i] (or
      // outputs[i]) alone: another value there, of another size, would
      // reach past it (views of it are aliases).
      case ValueStorage::kInput:
        if (v.index >= spec.inputs.size() || spec.inputs[v.index] != i) {
          fail(fmt::format("value '{}' claims input {}, which is not its value", v.name, v.index));
        }
        break;
      case ValueStorage::kOutput:
        if (v.index >= spec.outputs.size() || spec.outputs[v.index] != i) {
          fail(fmt::format("value '{}' claims output {}, which is not its value", v.name, v.index));
        }
        break;
      case ValueStorage::kAlias: {
        if (v.index >= i) fail(fmt::format("value '{}' aliases value {}, which does not come before it", v.name, v.index));
        const uint64_t base = spec.values[v.index].info.sizeInBytes();
        if (v.offset > base || size > base - v.offset) {
          fail(fmt::format("value '{}' ({} bytes at {}) lies outside the value it aliases", v.name, size, v.offset));
        }
        break;
      }
    }
  }
  // The model's inputs and outputs are the caller's buffers, in order.
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const ValueSpec& v = spec.values[spec.inputs[i]];
    if (v.storage != ValueStorage::kInput || v.index != i) {
      fail(fmt::format("input {} is value '{}', which is not the caller's input {}", i, v.name, i));
    }
  }
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    const ValueSpec& v = spec.values[spec.outputs[i]];
    if (v.storage != ValueStorage::kOutput || v.index != i) {
      fail(fmt::format("output {} is value '{}', which is not the caller's output {}", i, v.name, i));
    }
  }
  // Where a value's memory lies: its own storage, or its alias chain's end
  // (aliases point backwards, checked above, so the walk ends).
  auto rootOf = [&](uint32_t index) {
    while (spec.values[index].storage == ValueStorage::kAlias) index = spec.values[index].index;
    return spec.values[index].storage;
  };
  // The bytes a value occupies: its root's storage and index (0 for the
  // arena) and the byte range there, its aliases' offsets added up.
  struct Extent {
    ValueStorage storage;
    uint32_t index;
    uint64_t begin;
    uint64_t end;
  };
  auto extentOf = [&](uint32_t index) {
    const uint64_t size = spec.values[index].info.sizeInBytes();
    uint64_t begin = 0;
    while (spec.values[index].storage == ValueStorage::kAlias) {
      begin += spec.values[index].offset;  // each alias lies inside its base (checked above): no wrap
      index = spec.values[index].index;
    }
    const ValueSpec& root = spec.values[index];
    if (root.storage == ValueStorage::kArena) return Extent{root.storage, 0, root.offset + begin, root.offset + begin + size};
    return Extent{root.storage, root.index, begin, begin + size};
  };
  auto overlap = [](const Extent& a, const Extent& b) {
    return a.storage == b.storage && a.index == b.index && a.begin < b.end && b.begin < a.end;
  };
  // Kernels access elements as their type: each value starts on a multiple
  // of its element size in its storage (the arena, constants and buffers
  // themselves are 64-byte aligned).
  for (uint32_t i = 0; i < value_count; ++i) {
    const uint64_t element = std::max<uint64_t>(1, dtypeSize(spec.values[i].info.dtype));
    const uint64_t at = extentOf(i).begin;
    if (at % element != 0) {
      fail(fmt::format("value '{}' starts at byte {} of its storage, not on a {}-byte element boundary",
                       spec.values[i].name, at, element));
    }
  }
  // Kernels read their inputs while they write their outputs (and memcpy
  // them): the compiler never places an output over an input or another
  // output of the same step, and a package that does is refused. The one
  // exception: a plugin op's in-place output o may be exactly its input o
  // (the kernel checks the op really is in place).
  auto checkDisjoint = [&](const StepSpec& step) {
    const int64_t inplace = step.kernel == "kiln.Plugin" ? step.params.getInt("plugin_inplace", 0) : 0;
    // A fused elementwise step reads each block of an input of its output's
    // shape before it stores that block: it may write over such an input.
    const bool elementwise = step.kernel == "kiln.FusedElementwise";
    for (size_t o = 0; o < step.outputs.size(); ++o) {
      const Extent out = extentOf(step.outputs[o]);
      if (out.begin == out.end) continue;
      for (const auto* list : {&step.inputs, &step.outputs}) {
        for (size_t k = 0; k < list->size(); ++k) {
          const uint32_t other = (*list)[k];
          if (other == kNoValueIndex || (list == &step.outputs && k <= o)) continue;
          const bool may_alias = (k == o && static_cast<int64_t>(o) < inplace) ||
                                 (elementwise && spec.values[other].info.shape == spec.values[step.outputs[o]].info.shape);
          if (list == &step.inputs && may_alias) {
            const Extent read = extentOf(other);
            const bool same = read.storage == out.storage && read.index == out.index && read.begin == out.begin &&
                              read.end == out.end;
            if (same) continue;
          }
          if (overlap(out, extentOf(other))) {
            fail(fmt::format("step '{}' writes value '{}' over value '{}', which it also {}", step.kernel,
                             spec.values[step.outputs[o]].name, spec.values[other].name,
                             list == &step.inputs ? "reads" : "writes"));
          }
        }
      }
    }
  };
  // A plugin step's inputs lie as its allocator hook asked (the kernel
  // reads their padding): aligned in their storage, and padded only in the
  // arena, inside it. (The planner keeps the padding free while the step
  // runs; like every lifetime, that is the compiler's to get right.)
  auto checkLayouts = [&](const StepSpec& step) {
    if (step.kernel != "kiln.Plugin") return;
    const std::vector<int64_t> alignments = step.params.getInts("plugin_input_alignments", {});
    const std::vector<int64_t> paddings = step.params.getInts("plugin_input_paddings", {});
    if (alignments.empty() && paddings.empty()) return;
    if (alignments.size() != step.inputs.size() || paddings.size() != step.inputs.size()) {
      fail(fmt::format("plugin step has {} alignments and {} paddings for {} inputs", alignments.size(),
                       paddings.size(), step.inputs.size()));
    }
    for (size_t i = 0; i < step.inputs.size(); ++i) {
      if (step.inputs[i] == kNoValueIndex) continue;
      const auto alignment = static_cast<uint64_t>(alignments[i]);
      const auto padding = static_cast<uint64_t>(paddings[i]);
      if (alignments[i] < 1 || alignment > KILN_PLUGIN_MAX_ALIGNMENT || !std::has_single_bit(alignment) || paddings[i] < 0 ||
          padding > KILN_PLUGIN_MAX_PADDING) {
        fail(fmt::format("plugin step input {} has the layout alignment {}, padding {}", i, alignments[i], paddings[i]));
      }
      const ValueSpec& value = spec.values[step.inputs[i]];
      const Extent extent = extentOf(step.inputs[i]);
      const bool holds = extent.begin % alignment == 0 &&
                         storageHoldsLayout(extent.storage, dtypeSize(value.info.dtype), alignment, padding) &&
                         (extent.storage != ValueStorage::kArena || padding <= spec.arena_bytes - extent.end);
      if (!holds) {
        fail(fmt::format("plugin step input '{}' does not lie as its op asks ({}-byte aligned, {} bytes of padding)",
                         value.name, alignment, padding));
      }
    }
  };
  // A fused elementwise step writing its output straight over a variable
  // (a whole constant: the value is the constant itself).
  auto writesConstantInPlace = [&](const StepSpec& step, uint32_t index) {
    return step.kernel == "kiln.FusedElementwise" && step.outputs.size() == 1 &&
           spec.values[index].storage == ValueStorage::kConstant && spec.values[index].offset == 0;
  };
  // `limit`: the sub-programs a step may run (those listed before its own
  // sub-program), so that sub-programs cannot run themselves.
  auto checkSteps = [&](const std::vector<StepSpec>& steps, size_t limit) {
    for (const StepSpec& step : steps) {
      // Inputs may be omitted (optional operands); outputs never are.
      for (const auto* list : {&step.inputs, &step.outputs}) {
        for (uint32_t index : *list) {
          if ((index != kNoValueIndex || list == &step.outputs) && index >= value_count) {
            fail(fmt::format("step '{}' refers to value {} of {}", step.kernel, index, value_count));
          }
        }
      }
      // Constants are read-only mappings of the file, inputs the caller's
      // (possibly immutable) buffers: no step may write into either, but
      // kiln.Assign may replace a whole constant (a variable; the runtimes
      // give those writable memory: writtenConstants).
      for (uint32_t index : step.outputs) {
        const ValueStorage root = rootOf(index);
        if (step.kernel == "kiln.Assign" && spec.values[index].storage == ValueStorage::kConstant &&
            step.inputs.size() == 1 && step.outputs.size() == 1 && step.inputs[0] != kNoValueIndex &&
            spec.values[step.inputs[0]].info.sizeInBytes() == spec.values[index].info.sizeInBytes()) {
          continue;
        }
        if (writesConstantInPlace(step, index)) continue;
        if (root == ValueStorage::kConstant || root == ValueStorage::kInput) {
          fail(fmt::format("step '{}' writes value '{}', which lies in {}", step.kernel, spec.values[index].name,
                           root == ValueStorage::kConstant ? "a constant" : "a model input"));
        }
      }
      checkDisjoint(step);
      checkLayouts(step);
      for (uint32_t program : step.subprograms) {
        if (program >= limit) fail(fmt::format("step '{}' runs sub-program {} of {}", step.kernel, program, limit));
      }
    }
  };
  checkSteps(spec.steps, spec.subprograms.size());
  for (size_t k = 0; k < spec.subprograms.size(); ++k) {
    const SubProgramSpec& program = spec.subprograms[k];
    for (const auto* list : {&program.inputs, &program.outputs}) {
      for (uint32_t index : *list) {
        if (index >= value_count) fail(fmt::format("sub-program {} refers to value {} of {}", k, index, value_count));
      }
    }
    for (uint32_t index : program.inputs) {
      if (spec.values[index].storage != ValueStorage::kArena) {
        fail(fmt::format("sub-program {} input '{}' is not an arena value", k, spec.values[index].name));
      }
    }
    checkSteps(program.steps, k);
  }
  return spec;
}

void verifyModels(const PackageReader& reader, const std::string& source) {
  for (const MetadataBlob* model : reader.metadata()) {
    const Metadata& metadata = model->metadata();
    if (isGraphPackage(metadata)) continue;
    const ExecutableBlob* executable = reader.findExecutable(metadata.executable);
    if (executable == nullptr) continue;  // the reader refuses a dangling reference
    const std::string where = fmt::format("{} (executable '{}')", source, executable->name());
    checkAnchorsMatch(metadata, decodeExecutable(executable->read(), where), where, model->info().offset);
  }
}

std::set<std::string> writtenConstants(const ExecutableSpec& spec) {
  std::set<std::string> written;
  const auto scan = [&](const std::vector<StepSpec>& steps) {
    for (const StepSpec& step : steps) {
      if (step.kernel != "kiln.Assign" && step.kernel != "kiln.FusedElementwise") continue;
      for (uint32_t output : step.outputs) {
        if (output < spec.values.size() && spec.values[output].storage == ValueStorage::kConstant &&
            spec.values[output].index < spec.constants.size()) {
          written.insert(spec.constants[spec.values[output].index]);
        }
      }
    }
  };
  scan(spec.steps);
  for (const SubProgramSpec& program : spec.subprograms) scan(program.steps);
  return written;
}

void checkAnchorsMatch(const Metadata& metadata, const ExecutableSpec& spec, const std::string& source,
                       uint64_t offset) {
  const std::vector<const Anchor*> outputs = metadata.outputs();
  if (outputs.size() != spec.outputs.size()) {
    throw FormatError(source, offset, "metadata and executable disagree on the outputs");
  }
  auto disagree = [&](const Anchor& anchor, const TensorInfo& value) {
    throw FormatError(source, offset,
                      fmt::format("anchor '{}' is {} but the executable's value is {}", anchor.name,
                                  anchor.info.toString(), value.toString()));
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TensorInfo& value = spec.values[spec.outputs[i]].info;
    if (!outputs[i]->info.isStatic() || value.dtype != outputs[i]->info.dtype ||
        value.sizeInBytes() != outputs[i]->info.sizeInBytes()) {
      disagree(*outputs[i], value);
    }
  }
  // The main program's input anchors are the caller's buffers, in the
  // executable's input order (Executable binds them by position).
  const std::vector<const Anchor*> inputs = metadata.mainInputs();
  if (inputs.size() != spec.inputs.size()) {
    throw FormatError(source, offset,
                      fmt::format("metadata has {} main-program inputs, the executable {}", inputs.size(),
                                  spec.inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorInfo& value = spec.values[spec.inputs[i]].info;
    if (!inputs[i]->info.isStatic() || value.dtype != inputs[i]->info.dtype ||
        value.sizeInBytes() != inputs[i]->info.sizeInBytes()) {
      disagree(*inputs[i], value);
    }
  }
  // A save anchor reads back a load anchor (a variable): the same name and
  // type, so that the bytes copied back fit.
  for (const Anchor* saved : metadata.saveAnchors()) {
    const Anchor* loaded = metadata.findAnchor(saved->name, AnchorDirection::kInput);
    if (loaded == nullptr || !metadata.isLoadAnchor(*loaded) || !saved->info.isStatic() ||
        loaded->info.dtype != saved->info.dtype || loaded->info.sizeInBytes() != saved->info.sizeInBytes()) {
      throw FormatError(source, offset,
                        fmt::format("save anchor '{}' ({}) reads back no load anchor of its name and type",
                                    saved->name, saved->info.toString()));
    }
  }
}

}  // namespace kiln
