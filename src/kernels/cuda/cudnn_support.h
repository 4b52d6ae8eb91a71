// What the cuDNN kernels (conv.cc, pool.cc) share: an owner for cuDNN's
// descriptors, and the readers of the attributes convolutions and pooling
// have in common. Each declines (KernelUnsupported) what it cannot take, so
// that the step runs on the host instead.
#pragma once

#include <cudnn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/param_map.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/kernel.h"

namespace kiln::cuda {

using Ints = std::vector<int64_t>;

// Owns one cuDNN descriptor: created on construction, destroyed with the
// owner (the kernel state).
template <typename Handle, cudnnStatus_t (*create)(Handle*), cudnnStatus_t (*destroy)(Handle)>
class Descriptor {
 public:
  Descriptor() { check(create(&handle_), "cuDNN: creating a descriptor"); }
  ~Descriptor() {
    if (handle_ != nullptr) destroy(handle_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

using TensorDescriptor = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;

// "f32[1, 3, 224, 224]", for messages.
inline std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

// The int list attribute `name` with `size` values, each at least `minimum`;
// `fallback` when absent.
inline Ints sizedInts(std::string_view op, const ParamMap& params, const std::string& name, size_t size,
                      int64_t minimum, const Ints& fallback) {
  Ints values = params.getInts(name, fallback);
  if (values.size() != size) {
    throw KernelUnsupported(
        fmt::format("{} on cuda: attribute '{}' has {} values, {} expected", op, name, values.size(), size));
  }
  for (int64_t value : values) {
    if (value < minimum) {
      throw KernelUnsupported(fmt::format("{} on cuda: attribute '{}' [{}] has the value {}; at least {} expected", op,
                                          name, fmt::join(values, ", "), value, minimum));
    }
  }
  return values;
}

enum class AutoPad { kNotSet, kValid, kSameUpper, kSameLower };

inline AutoPad autoPad(std::string_view op, const ParamMap& params) {
  const std::string text = params.getString("auto_pad", "NOTSET");
  if (text == "NOTSET" || text.empty()) return AutoPad::kNotSet;
  if (text == "VALID") return AutoPad::kValid;
  if (text == "SAME_UPPER") return AutoPad::kSameUpper;
  if (text == "SAME_LOWER") return AutoPad::kSameLower;
  throw KernelUnsupported(
      fmt::format("{} on cuda: auto_pad is '{}', not NOTSET, VALID, SAME_UPPER or SAME_LOWER", op, text));
}

inline bool isSame(AutoPad auto_pad) { return auto_pad == AutoPad::kSameUpper || auto_pad == AutoPad::kSameLower; }

// cuDNN's name for an f32, f16 or bf16 tensor (the only types the cuDNN
// kernels take; f16 and bf16 under `kiln compile --fp16` and `--bf16`).
inline cudnnDataType_t cudnnDataType(DType dtype) {
  switch (dtype) {
    case DType::kF16: return CUDNN_DATA_HALF;
    case DType::kBF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

// A size as cuDNN's int dimensions.
inline int toInt(std::string_view op, int64_t value) {
  if (value < 0 || value > INT_MAX) {
    throw KernelUnsupported(fmt::format("{} on cuda: the size {} does not fit cuDNN's int dimensions", op, value));
  }
  return static_cast<int>(value);
}

}  // namespace kiln::cuda
