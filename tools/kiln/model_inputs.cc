#include "tools/kiln/model_inputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "kiln/error.h"
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

std::vector<NpyArray> loadInputs(const std::vector<TensorSlot>& inputs, const std::vector<std::string>& arguments,
                                 bool random_missing) {
  std::map<std::string, std::string> files;
  for (const std::string& input : arguments) {
    const size_t equals = input.find('=');
    if (equals == std::string::npos) throw UsageError("--input " + input + ": expected NAME=FILE.npy");
    files[input.substr(0, equals)] = input.substr(equals + 1);
  }
  for (const auto& [name, file] : files) {
    const bool known = std::any_of(inputs.begin(), inputs.end(),
                                   [&](const TensorSlot& slot) { return slot.name == name; });
    if (!known) throw UsageError(fmt::format("--input {}: the model has no input named '{}'", name, name));
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
      if (!slot.info.isStatic()) {
        throw UsageError(fmt::format("input '{}' ({}) has unknown dimensions: pass --input {}=FILE.npy", slot.name,
                                     slot.info.toString(), slot.name));
      }
      input_data.push_back(NpyArray{slot.info, randomTensor(slot.info, random)});
    } else {
      throw UsageError(fmt::format("input '{}' ({}) is not given: pass --input {}=FILE.npy or --random-inputs",
                                   slot.name, slot.info.toString(), slot.name));
    }
  }
  return input_data;
}

}  // namespace kiln::cli
