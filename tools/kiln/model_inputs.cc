#include "tools/kiln/model_inputs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "kiln/error.h"
#include "kiln/onnx_import.h"
#include "tools/kiln/npy.h"

namespace kiln::cli {

std::vector<std::byte> randomTensor(const TensorInfo& info, std::mt19937& random) {
  std::vector<std::byte> bytes(info.sizeInBytes());
  const uint64_t count = info.numElements();
  auto fill = [&](auto sample) {
    using T = decltype(sample(random));
    for (uint64_t i = 0; i < count; ++i) {
      const T value = sample(random);
      std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
    }
  };
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  std::uniform_int_distribution<int> integer(0, 9);
  switch (info.dtype) {
    case DType::kF32: fill([&](std::mt19937& r) { return real(r); }); break;
    case DType::kF64: fill([&](std::mt19937& r) { return static_cast<double>(real(r)); }); break;
    case DType::kI64: fill([&](std::mt19937& r) { return static_cast<int64_t>(integer(r)); }); break;
    case DType::kI32: fill([&](std::mt19937& r) { return static_cast<int32_t>(integer(r)); }); break;
    case DType::kBool: fill([&](std::mt19937& r) { return static_cast<uint8_t>(integer(r) & 1); }); break;
    default: throw UsageError(fmt::format("--random-inputs cannot make {} data", dtypeName(info.dtype)));
  }
  return bytes;
}

namespace {

// Whether `actual` fits `declared`, whose unknown dimensions (kDynamicDim)
// take any size.
bool fits(const TensorInfo& actual, const TensorInfo& declared) {
  if (actual.dtype != declared.dtype || actual.shape.size() != declared.shape.size()) return false;
  for (size_t i = 0; i < actual.shape.size(); ++i) {
    if (declared.shape[i] != kDynamicDim && declared.shape[i] != actual.shape[i]) return false;
  }
  return true;
}

}  // namespace

std::vector<NpyArray> loadInputs(const std::vector<TensorSlot>& inputs, const InputArguments& arguments,
                                 bool random_missing) {
  auto checkName = [&](const char* option, const std::string& name) {
    const bool known = std::any_of(inputs.begin(), inputs.end(),
                                   [&](const TensorSlot& slot) { return slot.name == name; });
    if (!known) throw UsageError(fmt::format("{} {}: the model has no input named '{}'", option, name, name));
  };
  std::map<std::string, std::string> files;
  for (const std::string& input : arguments.files) {
    const size_t equals = input.find('=');
    if (equals == std::string::npos) throw UsageError("--input " + input + ": expected NAME=FILE.npy");
    files[input.substr(0, equals)] = input.substr(equals + 1);
    checkName("--input", input.substr(0, equals));
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const std::string& shape : arguments.shapes) {
    const size_t colon = shape.rfind(':');
    if (colon == std::string::npos || colon == 0) throw UsageError("--shape " + shape + ": expected NAME:DIMS");
    shapes[shape.substr(0, colon)] = parseDims(shape.substr(colon + 1));
    checkName("--shape", shape.substr(0, colon));
  }
  std::mt19937 random(42);
  std::vector<NpyArray> input_data;
  for (const TensorSlot& slot : inputs) {
    const auto file = files.find(slot.name);
    if (file != files.end()) {
      NpyArray array = readNpy(file->second);
      if (!fits(array.info, slot.info)) {
        throw UsageError(fmt::format("input '{}' must be {}, but {} holds {}", slot.name, slot.info.toString(),
                                     file->second, array.info.toString()));
      }
      input_data.push_back(std::move(array));
    } else if (random_missing) {
      TensorInfo info = slot.info;
      const auto shape = shapes.find(slot.name);
      if (shape != shapes.end()) {
        info.shape = shape->second;
        if (!fits(info, slot.info)) {
          throw UsageError(fmt::format("--shape {}:{} does not fit input '{}', {}{}", slot.name,
                                       fmt::join(shape->second, "x"), slot.name, dtypeName(slot.info.dtype),
                                       slot.info.shapeString()));
        }
      }
      if (!info.isStatic()) {
        throw UsageError(fmt::format("input '{}' is {}{}: its size is known only at run time, so pass --shape "
                                     "{}:DIMS for random data, or --input {}=FILE.npy",
                                     slot.name, dtypeName(slot.info.dtype), slot.info.shapeString(), slot.name,
                                     slot.name));
      }
      input_data.push_back(NpyArray{info, randomTensor(info, random)});
    } else {
      throw UsageError(fmt::format("input '{}' ({}{}) is not given: pass --input {}=FILE.npy or --random-inputs",
                                   slot.name, dtypeName(slot.info.dtype), slot.info.shapeString(), slot.name));
    }
  }
  return input_data;
}

}  // namespace kiln::cli
