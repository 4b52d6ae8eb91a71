// Helpers for kernel tests: operands with their bytes, a prepared kernel from
// the CPU registry, random inputs with fixed seeds, and numpy broadcasting
// written out plainly for the references.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <algorithm>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln::testing {

// One tensor of a call: its type, its bytes, and whether prepare sees it as a
// constant. An omitted optional input has dtype kUndefined and no bytes.
struct Operand {
  TensorInfo info;
  std::vector<std::byte> bytes;
  bool constant = false;

  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T>
  std::vector<T> values() const {
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  TensorView view() {
    if (info.dtype == DType::kUndefined) return TensorView{};
    return viewOf(info, bytes.data());
  }
};

inline uint64_t elementCount(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

template <typename T>
Operand operand(std::vector<int64_t> shape, const std::vector<T>& values, bool constant = false) {
  Operand op;
  op.info = TensorInfo{dtypeOf<T>(), std::move(shape)};
  EXPECT_EQ(values.size(), elementCount(op.info.shape)) << "test operand has the wrong number of values";
  op.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(op.bytes.data(), values.data(), op.bytes.size());
  op.constant = constant;
  return op;
}

// [N, C, spatial...] values as [N, spatial..., C] (the kiln.Nhwc* kernels'
// layout), for references written in NCHW.
template <typename T>
std::vector<T> channelsLast(const std::vector<int64_t>& shape, const std::vector<T>& v) {
  const int64_t c = shape[1];
  const int64_t plane = static_cast<int64_t>(elementCount(shape)) / std::max<int64_t>(shape[0] * c, 1);
  std::vector<T> out(v.size());
  for (int64_t n = 0; n < shape[0]; ++n) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t p = 0; p < plane; ++p) {
        out[static_cast<size_t>((n * plane + p) * c + ch)] = v[static_cast<size_t>((n * c + ch) * plane + p)];
      }
    }
  }
  return out;
}

inline Operand omitted() { return Operand{}; }

// An output, filled with a pattern that no kernel result matches by chance.
inline Operand output(DType dtype, std::vector<int64_t> shape) {
  Operand op;
  op.info = TensorInfo{dtype, std::move(shape)};
  op.bytes.assign(elementCount(op.info.shape) * dtypeSize(dtype), std::byte{0xA5});
  return op;
}

template <typename T>
std::vector<T> randomValues(size_t count, uint32_t seed, double lo, double hi) {
  std::mt19937 engine(seed);
  std::vector<T> out(count);
  if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (T& v : out) v = static_cast<T>(dist(engine));
  } else {
    std::uniform_int_distribution<int64_t> dist(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
    for (T& v : out) v = static_cast<T>(dist(engine));
  }
  return out;
}

// A kernel from KernelRegistry::cpu(), prepared for the given operands.
class PreparedKernel {
 public:
  PreparedKernel(std::string_view op, const std::vector<Operand>& inputs, const std::vector<Operand>& outputs,
                 const ParamMap& params = {}) {
    def_ = KernelRegistry::cpu().find(op);
    if (def_ == nullptr) throw UsageError("test: no kernel " + std::string(op));
    std::vector<TensorInfo> input_infos;
    std::vector<const std::byte*> constants;
    for (const Operand& input : inputs) {
      input_infos.push_back(input.info);
      constants.push_back(input.constant ? input.bytes.data() : nullptr);
    }
    std::vector<TensorInfo> output_infos;
    for (const Operand& out : outputs) output_infos.push_back(out.info);
    const KernelSetup setup{params, input_infos, output_infos, constants};
    state_ = def_->prepare(setup);
  }

  // Views of the operands' current bytes, and a call over them. The views
  // must stay where they are while the call is used.
  struct Call {
    std::vector<TensorView> inputs;
    std::vector<TensorView> outputs;
    KernelCall call;
  };
  std::unique_ptr<Call> bind(std::vector<Operand>& inputs, std::vector<Operand>& outputs) const {
    auto bound = std::make_unique<Call>();
    for (Operand& input : inputs) bound->inputs.push_back(input.view());
    for (Operand& out : outputs) bound->outputs.push_back(out.view());
    bound->call = KernelCall{bound->inputs.data(), static_cast<uint32_t>(bound->inputs.size()), bound->outputs.data(),
                             static_cast<uint32_t>(bound->outputs.size()), state_.get()};
    return bound;
  }

  void run(std::vector<Operand>& inputs, std::vector<Operand>& outputs) const {
    def_->run(bind(inputs, outputs)->call);
  }
  void run(const KernelCall& call) const { def_->run(call); }

 private:
  const KernelDef* def_ = nullptr;
  std::unique_ptr<KernelState> state_;
};

// What prepare throws for these operands, or "(no error)".
inline std::string prepareError(std::string_view op, const std::vector<Operand>& inputs,
                                const std::vector<Operand>& outputs, const ParamMap& params = {}) {
  try {
    PreparedKernel kernel(op, inputs, outputs, params);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

// numpy broadcasting, the long way: the flat index into `in_shape` that
// element `flat` of `out_shape` reads.
inline size_t broadcastIndex(const std::vector<int64_t>& out_shape, const std::vector<int64_t>& in_shape, size_t flat) {
  std::vector<int64_t> coords(out_shape.size());
  for (size_t d = out_shape.size(); d-- > 0;) {
    coords[d] = static_cast<int64_t>(flat % static_cast<size_t>(out_shape[d]));
    flat /= static_cast<size_t>(out_shape[d]);
  }
  size_t index = 0;
  const size_t offset = out_shape.size() - in_shape.size();
  for (size_t d = 0; d < in_shape.size(); ++d) {
    const int64_t coord = in_shape[d] == 1 ? 0 : coords[offset + d];
    index = index * static_cast<size_t>(in_shape[d]) + static_cast<size_t>(coord);
  }
  return index;
}

inline std::vector<int64_t> broadcastShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t ad = d + a.size() >= rank ? a[d + a.size() - rank] : 1;
    const int64_t bd = d + b.size() >= rank ? b[d + b.size() - rank] : 1;
    out[d] = ad == 1 ? bd : ad;
  }
  return out;
}

// Parameters from {name, value} pairs.
inline ParamMap params(std::initializer_list<std::pair<const char*, ParamValue>> entries) {
  ParamMap map;
  for (const auto& [key, value] : entries) map.set(key, value);
  return map;
}

// The coordinates of element `flat` of `shape` (row-major).
inline std::vector<int64_t> unravel(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> coords(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coords[d] = flat % shape[d];
    flat /= shape[d];
  }
  return coords;
}

// An f32 shape as TensorInfo::shapeString writes it, for messages.
inline std::string shapeText(const std::vector<int64_t>& shape) {
  return TensorInfo{DType::kF32, shape}.shapeString();
}

}  // namespace kiln::testing
