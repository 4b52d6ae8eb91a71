#include "tools/kiln/random_inputs.h"

#include <fmt/format.h>

#include <cstring>

#include "kiln/error.h"

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

}  // namespace kiln::cli
