// Example kiln plugin: eight ops in the domain "com.example", after the
// reference's custom-op examples (docs/plugins.md walks through it).
//
//   Rotate(x, y, angle) -> (x', y')      x' = x cos a - y sin a,
//                                        y' = x sin a + y cos a
//       three inputs, two outputs, elementwise and stateless: kiln may run
//       it in slices on several threads, fold it and merge equal nodes. It
//       declares RotateGrad as its gradient op (the reference's Build_grad),
//       which gives the gradients of all three inputs at once
//       (separate_gradients = 0).
//   AddInPlace(a, b) -> a + b            written over a (num_inplace = 1).
//   SerializedMatMul(lhs, rhs) -> lhs @ rhs, attribute
//       serialization_factor: the product is computed in that many slices
//       of the inner dimension, each accumulated into the output through a
//       workspace the op asks kiln for (the reference's serialized matmul,
//       attributes as JSON). Its gradient op SerializedMatMulGrad gives one
//       input's gradient per node, the one named by input_grad_index
//       (separate_gradients = 1).
//   BlockScale(x) -> factor * x, attributes factor (default 2), block
//       (default 16) and alignment (default 64): computed in whole blocks of
//       `block` floats with no remainder loop. Its allocator hook (the
//       reference's Build_allocator, API level 2) asks kiln to lay x out
//       `alignment`-byte aligned with padding up to a whole block, which the
//       last block reads. BlockScaleInPlace is the same op written over x.
//   Swish(x) -> x * sigmoid(beta * x), attribute beta (default 1): a
//       composite op, built from ONNX's Mul and Sigmoid; kiln fuses the body
//       with its neighbours into one elementwise step, and the package needs
//       no plugin at run time. Training differentiates it through its body.
//
// Build: c++ -std=c++20 -O2 -fPIC -shared -I<kiln>/include example_ops.cc -o libkiln_example_ops.so
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/plugin.hpp"

namespace {

using kiln::plugin::Attributes;
using kiln::plugin::Error;

// Every input a float tensor of the first input's shape.
void requireSameFloatShapes(std::span<const KilnTensorType> inputs, const char* op) {
  for (const KilnTensorType& input : inputs) {
    if (input.dtype != KILN_DTYPE_FLOAT) throw Error(std::string(op) + ": inputs must be float32");
    if (input.rank != inputs[0].rank) throw Error(std::string(op) + ": inputs must have one shape");
    for (int32_t d = 0; d < input.rank; ++d) {
      const int64_t a = input.dims[d], b = inputs[0].dims[d];
      if (a >= 0 && b >= 0 && a != b) throw Error(std::string(op) + ": inputs must have one shape");
    }
  }
}

class Rotate {
 public:
  explicit Rotate(const Attributes&) {}

  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    requireSameFloatShapes(inputs, "Rotate");
    outputs[0] = inputs[0];
    outputs[1] = inputs[0];
  }

  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    const uint64_t n = kiln::plugin::elementCount(outputs[0]);
    const float* x = kiln::plugin::data<const float>(inputs[0]);
    const float* y = kiln::plugin::data<const float>(inputs[1]);
    const float* angle = kiln::plugin::data<const float>(inputs[2]);
    float* x_out = kiln::plugin::data<float>(outputs[0]);
    float* y_out = kiln::plugin::data<float>(outputs[1]);
    for (uint64_t i = 0; i < n; ++i) {
      const float c = std::cos(angle[i]), s = std::sin(angle[i]);
      x_out[i] = x[i] * c - y[i] * s;
      y_out[i] = x[i] * s + y[i] * c;
    }
  }
};

// RotateGrad(gx', gy', x, y, angle, x', y') -> (dx, dy, dangle): the
// gradient op's inputs are the forward outputs' gradients, then the forward
// inputs, then the forward outputs.
class RotateGrad {
 public:
  explicit RotateGrad(const Attributes&) {}

  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    requireSameFloatShapes(inputs, "RotateGrad");
    for (KilnTensorType& output : outputs) output = inputs[0];
  }

  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    const uint64_t n = kiln::plugin::elementCount(outputs[0]);
    const float* gx = kiln::plugin::data<const float>(inputs[0]);
    const float* gy = kiln::plugin::data<const float>(inputs[1]);
    const float* angle = kiln::plugin::data<const float>(inputs[4]);
    const float* x_out = kiln::plugin::data<const float>(inputs[5]);
    const float* y_out = kiln::plugin::data<const float>(inputs[6]);
    float* dx = kiln::plugin::data<float>(outputs[0]);
    float* dy = kiln::plugin::data<float>(outputs[1]);
    float* dangle = kiln::plugin::data<float>(outputs[2]);
    for (uint64_t i = 0; i < n; ++i) {
      const float c = std::cos(angle[i]), s = std::sin(angle[i]);
      dx[i] = gx[i] * c + gy[i] * s;
      dy[i] = gy[i] * c - gx[i] * s;
      dangle[i] = gy[i] * x_out[i] - gx[i] * y_out[i];  // d x'/da = -y', d y'/da = x'
    }
  }
};

class AddInPlace {
 public:
  explicit AddInPlace(const Attributes&) {}

  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    requireSameFloatShapes(inputs, "AddInPlace");
    outputs[0] = inputs[0];
  }

  // outputs[0].data is inputs[0].data: the op updates it.
  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    float* a = kiln::plugin::data<float>(outputs[0]);
    const float* b = kiln::plugin::data<const float>(inputs[1]);
    const uint64_t n = kiln::plugin::elementCount(outputs[0]);
    for (uint64_t i = 0; i < n; ++i) a[i] += b[i];
  }
};

class SerializedMatMul {
 public:
  explicit SerializedMatMul(const Attributes& attributes)
      : factor_(attributes.getInt("serialization_factor", 1)) {
    if (factor_ < 1) throw Error("serialization_factor must be 1 or more");
  }

  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    const KilnTensorType& lhs = inputs[0];
    const KilnTensorType& rhs = inputs[1];
    if (lhs.dtype != KILN_DTYPE_FLOAT || rhs.dtype != KILN_DTYPE_FLOAT || lhs.rank != 2 || rhs.rank != 2) {
      throw Error("SerializedMatMul takes two float32 matrices");
    }
    if (lhs.dims[1] >= 0 && rhs.dims[0] >= 0 && lhs.dims[1] != rhs.dims[0]) {
      throw Error("SerializedMatMul: inner dimensions " + std::to_string(lhs.dims[1]) + " and " +
                  std::to_string(rhs.dims[0]) + " differ");
    }
    if (lhs.dims[1] >= 0 && lhs.dims[1] % factor_ != 0) {
      throw Error("serialization_factor " + std::to_string(factor_) + " does not divide the inner dimension " +
                  std::to_string(lhs.dims[1]));
    }
    outputs[0] = KilnTensorType{};
    outputs[0].dtype = KILN_DTYPE_FLOAT;
    outputs[0].rank = 2;
    outputs[0].dims[0] = lhs.dims[0];
    outputs[0].dims[1] = rhs.dims[1];
  }

  // One slice's partial product.
  uint64_t workspaceBytes(std::span<const KilnTensorType>, std::span<const KilnTensorType> outputs) const {
    return static_cast<uint64_t>(outputs[0].dims[0] * outputs[0].dims[1]) * sizeof(float);
  }

  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs,
               std::span<std::byte> workspace) const {
    const int64_t m = inputs[0].dims[0], k = inputs[0].dims[1], n = inputs[1].dims[1];
    const float* lhs = kiln::plugin::data<const float>(inputs[0]);
    const float* rhs = kiln::plugin::data<const float>(inputs[1]);
    float* out = kiln::plugin::data<float>(outputs[0]);
    auto* partial = reinterpret_cast<float*>(workspace.data());
    std::memset(out, 0, static_cast<size_t>(m * n) * sizeof(float));
    const int64_t slice = k / factor_;
    for (int64_t s = 0; s < factor_; ++s) {
      std::memset(partial, 0, static_cast<size_t>(m * n) * sizeof(float));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t p = s * slice; p < (s + 1) * slice; ++p) {
          const float a = lhs[i * k + p];
          for (int64_t j = 0; j < n; ++j) partial[i * n + j] += a * rhs[p * n + j];
        }
      }
      for (int64_t i = 0; i < m * n; ++i) out[i] += partial[i];
    }
  }

 private:
  int64_t factor_;
};

class BlockScale {
 public:
  explicit BlockScale(const Attributes& attributes)
      : factor_(static_cast<float>(attributes.getFloat("factor", 2.0))),
        block_(attributes.getInt("block", 16)),
        alignment_(attributes.getInt("alignment", 64)) {
    if (block_ < 1 || block_ > 1024) throw Error("block must be 1 to 1024 elements");
    if (alignment_ < 1 || (alignment_ & (alignment_ - 1)) != 0) throw Error("alignment must be a power of two");
  }

  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    if (inputs[0].dtype != KILN_DTYPE_FLOAT) throw Error("BlockScale takes float32");
    outputs[0] = inputs[0];
  }

  // The allocator hook: x aligned, and readable up to a whole last block.
  KilnInputLayout inputLayout(int32_t, std::span<const KilnTensorType> inputs) const {
    const uint64_t n = kiln::plugin::elementCount(inputs[0]);
    const uint64_t whole = (n + block_ - 1) / block_ * block_;
    return KilnInputLayout{static_cast<uint64_t>(alignment_), (whole - n) * sizeof(float)};
  }

  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    const uint64_t n = kiln::plugin::elementCount(outputs[0]);
    const float* x = kiln::plugin::data<const float>(inputs[0]);
    float* y = kiln::plugin::data<float>(outputs[0]);
    if (reinterpret_cast<uintptr_t>(x) % static_cast<uintptr_t>(alignment_) != 0) {
      throw Error("x is not " + std::to_string(alignment_) + "-byte aligned");
    }
    float lanes[1024];
    for (uint64_t begin = 0; begin < n; begin += block_) {
      std::memcpy(lanes, x + begin, block_ * sizeof(float));  // the last block reads the padding
      for (int64_t i = 0; i < block_; ++i) lanes[i] *= factor_;
      std::memcpy(y + begin, lanes, std::min<uint64_t>(block_, n - begin) * sizeof(float));
    }
  }

 private:
  float factor_;
  int64_t block_;
  int64_t alignment_;
};

// SerializedMatMulGrad(g, lhs, rhs, out), attribute input_grad_index: g @
// rhs^T (0, the gradient of lhs) or lhs^T @ g (1, of rhs).
class SerializedMatMulGrad {
 public:
  explicit SerializedMatMulGrad(const Attributes& attributes) : input_(attributes.getInt("input_grad_index", -1)) {
    if (input_ != 0 && input_ != 1) throw Error("SerializedMatMulGrad: input_grad_index must be 0 or 1");
  }

  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    outputs[0] = inputs[1 + input_];  // the gradient has its input's type
  }

  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    const int64_t m = inputs[1].dims[0], k = inputs[1].dims[1], n = inputs[2].dims[1];
    const float* g = kiln::plugin::data<const float>(inputs[0]);
    const float* lhs = kiln::plugin::data<const float>(inputs[1]);
    const float* rhs = kiln::plugin::data<const float>(inputs[2]);
    float* out = kiln::plugin::data<float>(outputs[0]);
    if (input_ == 0) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t p = 0; p < k; ++p) {
          float sum = 0;
          for (int64_t j = 0; j < n; ++j) sum += g[i * n + j] * rhs[p * n + j];
          out[i * k + p] = sum;
        }
      }
    } else {
      for (int64_t p = 0; p < k; ++p) {
        for (int64_t j = 0; j < n; ++j) {
          float sum = 0;
          for (int64_t i = 0; i < m; ++i) sum += lhs[i * k + p] * g[i * n + j];
          out[p * n + j] = sum;
        }
      }
    }
  }

 private:
  int64_t input_;
};

class Swish {
 public:
  explicit Swish(const Attributes& attributes) : beta_(attributes.getFloat("beta", 1.0)) {}

  std::vector<int32_t> build(kiln::plugin::Builder& body, std::span<const int32_t> inputs) const {
    const int32_t x = inputs[0];
    const int32_t scaled = beta_ == 1.0 ? x : body.add("Mul", {x, body.constant(static_cast<float>(beta_))});
    return {body.add("Mul", {x, body.add("Sigmoid", {scaled})})};
  }

 private:
  double beta_;
};

}  // namespace

// Level 2: BlockScale's allocator hook.
KILN_PLUGIN_API_LEVEL_NEEDED(2);

KILN_PLUGIN_REGISTER(host) {
  kiln::plugin::addOp<Rotate>(host, {.domain = "com.example", .name = "Rotate", .min_inputs = 3, .max_inputs = 3,
                                     .min_outputs = 2, .max_outputs = 2, .elementwise = true, .stateless = true,
                                     .gradient_op = "RotateGrad"});
  kiln::plugin::addOp<RotateGrad>(host, {.domain = "com.example", .name = "RotateGrad", .min_inputs = 7,
                                         .max_inputs = 7, .min_outputs = 3, .max_outputs = 3, .elementwise = true,
                                         .stateless = true});
  kiln::plugin::addOp<AddInPlace>(host, {.domain = "com.example", .name = "AddInPlace", .min_inputs = 2,
                                         .max_inputs = 2, .num_inplace = 1});
  kiln::plugin::addOp<SerializedMatMul>(host, {.domain = "com.example", .name = "SerializedMatMul", .min_inputs = 2,
                                               .max_inputs = 2, .stateless = true,
                                               .gradient_op = "SerializedMatMulGrad", .separate_gradients = true});
  kiln::plugin::addOp<SerializedMatMulGrad>(host, {.domain = "com.example", .name = "SerializedMatMulGrad",
                                                   .min_inputs = 4, .max_inputs = 4, .stateless = true});
  kiln::plugin::addOp<BlockScale>(host, {.domain = "com.example", .name = "BlockScale", .stateless = true});
  kiln::plugin::addOp<BlockScale>(host, {.domain = "com.example", .name = "BlockScaleInPlace", .num_inplace = 1,
                                         .stateless = true});
  kiln::plugin::addOp<Swish>(host, {.domain = "com.example", .name = "Swish", .stateless = true});
}
