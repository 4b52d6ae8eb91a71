// Plugin libraries for the plugin tests, one source built several ways
// (tests/plugins/CMakeLists.txt):
//   (default)                 libkiln_test_plugin.so: the ops below
//   KILN_TEST_PLUGIN_FUTURE   needs the API level above kiln's
//   KILN_TEST_PLUGIN_LEVEL1   com.level1.Double registered with a level-1
//                             KilnOp (no allocator hook; junk where
//                             level 2 has it)
//   KILN_TEST_PLUGIN_NO_REGISTER  exports no kiln_plugin_register
//   KILN_TEST_PLUGIN_SHORT    com.short.Double registered with a KilnOp of
//                             the required fields only (an older header)
//   KILN_TEST_PLUGIN_LONG     com.long.Double with a KilnOp followed by a
//                             field kiln does not know (a newer header)
//   KILN_TEST_PLUGIN_RESERVED an op in ONNX's own domain (refused)
//
// Ops of the default library, domain com.test, all f32:
//   Double(x) -> 2x                 stateless
//   DoubleStateful(x) -> 2x         stateful (the default)
//   Copy(x) -> x                    memcpy, stateful (bench/plugin_bench.cc)
//   CountCalls(x) -> x + 1          elementwise and stateless; counts its
//   CountCallsWhole(x) -> x + 1     compute calls in kiln_test_calls()
//   NegativeDim(x) -> infers a dimension of -5
//   BadDType(x) -> infers dtype 1234
//   Fails(x) -> compute returns an error
//   Throws(x) -> compute throws (the wrapper reports it)
//   NeedsPositiveScale(x), attribute scale > 0 (create refuses others) -> x * scale
//   WritesPastEnd(x) -> writes one element past its output (a plugin bug
//                       that AddressSanitizer builds must catch)
//   BadComposite(x)  -> a composite whose build names a value that does not exist
//   Recursive(x)     -> a composite whose body is itself
//   BadAlignment(x), HugePadding(x), LayoutFails(x) -> 2x, with an allocator
//                       hook asking for a 48-byte alignment, 2 MiB of
//                       padding, or throwing
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "kiln/plugin.hpp"

namespace {

using kiln::plugin::Attributes;

std::atomic<int> calls{0};

// y = x * factor + offset, for the simple ops.
int scaleCompute(const KilnTensor* inputs, KilnTensor* outputs, float factor, float offset) {
  const uint64_t n = kiln::plugin::elementCount(outputs[0]);
  const float* __restrict x = static_cast<const float*>(inputs[0].data);
  float* __restrict y = static_cast<float*>(outputs[0].data);
  for (uint64_t i = 0; i < n; ++i) y[i] = x[i] * factor + offset;
  return 0;
}

int sameType(const void*, const KilnTensorType* inputs, int32_t, KilnTensorType* outputs, int32_t, char* error,
             size_t capacity) {
  if (inputs[0].dtype != KILN_DTYPE_FLOAT) {
    std::snprintf(error, capacity, "takes float32");
    return 1;
  }
  outputs[0] = inputs[0];
  return 0;
}

int doubleCompute(const void*, const KilnTensor* inputs, int32_t, KilnTensor* outputs, int32_t, void*, uint64_t, char*,
                  size_t) {
  return scaleCompute(inputs, outputs, 2.0f, 0.0f);
}

// An op from the C ABI alone (no wrapper): `size` bytes of struct.
KilnOp cOp(const char* domain, const char* name) {
  KilnOp op;
  std::memset(&op, 0, sizeof op);
  op.struct_size = sizeof(KilnOp);
  op.domain = domain;
  op.name = name;
  op.since_version = 1;
  op.min_inputs = op.max_inputs = 1;
  op.min_outputs = op.max_outputs = 1;
  op.infer = &sameType;
  op.compute = &doubleCompute;
  return op;
}

void registerOrThrow(const KilnPluginHost* host, const KilnOp* op) {
  char error[512] = {0};
  if (host->register_op(host->context, op, error, sizeof error) != 0) throw kiln::plugin::Error(error);
}

class CountCalls {
 public:
  explicit CountCalls(const Attributes&) {}
  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const { outputs[0] = inputs[0]; }
  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    calls.fetch_add(1);
    scaleCompute(inputs.data(), outputs.data(), 1.0f, 1.0f);
  }
};

class NegativeDim {
 public:
  explicit NegativeDim(const Attributes&) {}
  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    outputs[0] = inputs[0];
    outputs[0].dims[0] = -5;
  }
  void compute(std::span<const KilnTensor>, std::span<KilnTensor>, std::span<std::byte>) const {}
};

class BadDType {
 public:
  explicit BadDType(const Attributes&) {}
  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const {
    outputs[0] = inputs[0];
    outputs[0].dtype = 1234;
  }
  void compute(std::span<const KilnTensor>, std::span<KilnTensor>, std::span<std::byte>) const {}
};

int copyCompute(const void*, const KilnTensor* inputs, int32_t, KilnTensor* outputs, int32_t, void*, uint64_t, char*,
                size_t) {
  std::memcpy(outputs[0].data, inputs[0].data, kiln::plugin::elementCount(outputs[0]) * sizeof(float));
  return 0;
}

int failingCompute(const void*, const KilnTensor*, int32_t, KilnTensor*, int32_t, void*, uint64_t, char* error,
                   size_t capacity) {
  std::snprintf(error, capacity, "the device is on fire");
  return 7;
}

class Throws {
 public:
  explicit Throws(const Attributes&) {}
  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const { outputs[0] = inputs[0]; }
  void compute(std::span<const KilnTensor>, std::span<KilnTensor>, std::span<std::byte>) const {
    throw std::out_of_range("index 12 past the end");
  }
};

class WritesPastEnd {
 public:
  explicit WritesPastEnd(const Attributes&) {}
  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const { outputs[0] = inputs[0]; }
  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    const uint64_t n = kiln::plugin::elementCount(outputs[0]);
    volatile float* y = kiln::plugin::data<float>(outputs[0]);
    for (uint64_t i = 0; i <= n; ++i) y[i] = kiln::plugin::data<const float>(inputs[0])[0];
  }
};

class BadComposite {
 public:
  explicit BadComposite(const Attributes&) {}
  std::vector<int32_t> build(kiln::plugin::Builder& body, std::span<const int32_t> inputs) const {
    return {body.add("Relu", {inputs[0] + 41})};
  }
};

class Recursive {
 public:
  explicit Recursive(const Attributes&) {}
  std::vector<int32_t> build(kiln::plugin::Builder& body, std::span<const int32_t> inputs) const {
    return body.node("Recursive", {inputs[0]}, {}, 1, "com.test");
  }
};

class NeedsPositiveScale {
 public:
  explicit NeedsPositiveScale(const Attributes& attributes) : scale_(static_cast<float>(attributes.getFloat("scale", 1))) {
    if (!(scale_ > 0)) throw kiln::plugin::Error("scale must be positive");
  }
  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const { outputs[0] = inputs[0]; }
  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    scaleCompute(inputs.data(), outputs.data(), scale_, 0.0f);
  }

 private:
  float scale_;
};

// 2x, with an allocator hook asking for `alignment` and `padding` (an
// alignment of 0: the hook throws).
template <uint64_t alignment, uint64_t padding>
class WithLayout {
 public:
  explicit WithLayout(const Attributes&) {}
  void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const { outputs[0] = inputs[0]; }
  KilnInputLayout inputLayout(int32_t, std::span<const KilnTensorType>) const {
    if (alignment == 0) throw kiln::plugin::Error("no layout for you");
    return KilnInputLayout{alignment, padding};
  }
  void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs, std::span<std::byte>) const {
    scaleCompute(inputs.data(), outputs.data(), 2.0f, 0.0f);
  }
};

}  // namespace

// How many times CountCalls / CountCallsWhole computed since the last reset.
KILN_PLUGIN_EXPORT int kiln_test_calls(int reset) { return reset ? calls.exchange(0) : calls.load(); }

#if defined(KILN_TEST_PLUGIN_FUTURE)
KILN_PLUGIN_API_LEVEL_NEEDED(KILN_PLUGIN_API_LEVEL + 1);
#elif defined(KILN_TEST_PLUGIN_LEVEL1) || defined(KILN_TEST_PLUGIN_SHORT) || defined(KILN_TEST_PLUGIN_LONG)
KILN_PLUGIN_API_LEVEL_NEEDED(1);
#else
KILN_PLUGIN_API_LEVEL_NEEDED(2);
#endif

#if !defined(KILN_TEST_PLUGIN_NO_REGISTER)
KILN_PLUGIN_REGISTER(host) {
#if defined(KILN_TEST_PLUGIN_SHORT)
  KilnOp op = cOp("com.short", "Double");
  op.struct_size = KILN_OP_MIN_SIZE;
  op.create = reinterpret_cast<decltype(op.create)>(0x1);  // past struct_size: kiln must not read it
  op.num_inplace = 99;
  registerOrThrow(host, &op);
#elif defined(KILN_TEST_PLUGIN_LEVEL1)
  KilnOp op = cOp("com.level1", "Double");
  op.struct_size = offsetof(KilnOp, input_layout);  // what sizeof(KilnOp) was at level 1
  op.input_layout = reinterpret_cast<decltype(op.input_layout)>(0x1);  // past struct_size: never called
  registerOrThrow(host, &op);
#elif defined(KILN_TEST_PLUGIN_LONG)
  struct NewerOp {
    KilnOp op;
    uint64_t field_of_a_later_level;
  } newer;
  newer.op = cOp("com.long", "Double");
  newer.op.struct_size = sizeof(NewerOp);
  newer.field_of_a_later_level = 42;
  registerOrThrow(host, &newer.op);
#elif defined(KILN_TEST_PLUGIN_RESERVED)
  const KilnOp op = cOp("", "Relu");
  registerOrThrow(host, &op);
#else
  KilnOp stateless = cOp("com.test", "Double");
  stateless.is_stateless = 1;
  registerOrThrow(host, &stateless);
  const KilnOp stateful = cOp("com.test", "DoubleStateful");
  registerOrThrow(host, &stateful);
  KilnOp copy = cOp("com.test", "Copy");
  copy.compute = &copyCompute;
  registerOrThrow(host, &copy);
  KilnOp fails = cOp("com.test", "Fails");
  fails.compute = &failingCompute;
  registerOrThrow(host, &fails);
  kiln::plugin::addOp<CountCalls>(host, {.domain = "com.test", .name = "CountCalls", .elementwise = true,
                                         .stateless = true});
  kiln::plugin::addOp<CountCalls>(host, {.domain = "com.test", .name = "CountCallsWhole", .stateless = true});
  kiln::plugin::addOp<NegativeDim>(host, {.domain = "com.test", .name = "NegativeDim"});
  kiln::plugin::addOp<BadDType>(host, {.domain = "com.test", .name = "BadDType"});
  kiln::plugin::addOp<Throws>(host, {.domain = "com.test", .name = "Throws"});
  kiln::plugin::addOp<NeedsPositiveScale>(host, {.domain = "com.test", .name = "NeedsPositiveScale"});
  kiln::plugin::addOp<WritesPastEnd>(host, {.domain = "com.test", .name = "WritesPastEnd"});
  kiln::plugin::addOp<BadComposite>(host, {.domain = "com.test", .name = "BadComposite"});
  kiln::plugin::addOp<Recursive>(host, {.domain = "com.test", .name = "Recursive"});
  kiln::plugin::addOp<WithLayout<48, 0>>(host, {.domain = "com.test", .name = "BadAlignment"});
  kiln::plugin::addOp<WithLayout<64, (4u << 20)>>(host, {.domain = "com.test", .name = "HugePadding"});
  kiln::plugin::addOp<WithLayout<0, 0>>(host, {.domain = "com.test", .name = "LayoutFails"});
#endif
}
#endif
