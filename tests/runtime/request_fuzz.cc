// libFuzzer target for the ModelRunner's run-time request validation
// (issue 13): requests built from the input bytes (anchor names, byte
// counts, dtypes, null pointers, caller-allocated outputs or not, either
// runner) go into two cpu ModelRunners over a small affine model, one with
// batching_dim 0 and one without. Each request must either be refused at
// the call with UsageError, or complete with the right result; never a
// crash, a read or write outside the buffers the request gives (the
// sanitizers check), a hang or a wrong answer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "kiln/compiler.h"
#include "kiln/error.h"
#include "kiln/graph.h"
#include "kiln/model_runner.h"

namespace {

using namespace kiln;

constexpr int64_t kBatch = 4;
constexpr int64_t kFeatures = 8;

float weight(int64_t i, int64_t j) { return (i == j ? 2.0f : 0.0f) + 0.01f * static_cast<float>(i + j); }

ConstantPtr floats(const std::vector<int64_t>& shape, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return makeConstant(TensorInfo{DType::kF32, shape}, std::move(bytes));
}

// y[4, 8] = x @ w + b, compiled once per process.
std::filesystem::path compileModel() {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln_request_fuzz_" + std::to_string(::getpid()) + ".kiln");
  Graph graph;
  std::vector<float> w(kFeatures * kFeatures), b(kFeatures);
  for (int64_t i = 0; i < kFeatures; ++i) {
    b[i] = static_cast<float>(i);
    for (int64_t j = 0; j < kFeatures; ++j) w[i * kFeatures + j] = weight(i, j);
  }
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {kBatch, kFeatures}));
  const ValueId wv = graph.addInitializer("w", floats({kFeatures, kFeatures}, w));
  const ValueId bv = graph.addInitializer("b", floats({kFeatures}, b));
  const ValueId xw = graph.node(graph.addNode("MatMul", {x, wv}, {"xw"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Add", {xw, bv}, {"y"})).outputs[0]);
  compile(graph, {{"", 17}}, path);
  return path;
}

struct Runners {
  std::filesystem::path package = compileModel();
  std::unique_ptr<ModelRunner> whole, rows;
  Runners() {
    ModelRunnerConfig config;
    config.device_kind = DeviceKind::kCpu;
    config.timeout_ns = std::chrono::microseconds(50);
    whole = std::make_unique<ModelRunner>(package, config);
    config.batching_dim = 0;
    rows = std::make_unique<ModelRunner>(package, config);
    std::filesystem::remove(package);  // the runners hold it open
  }
};

// Reads the fuzzer's bytes as small numbers; zeros once they run out.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t next(uint32_t limit) { return limit == 0 ? 0 : (at_ < size_ ? data_[at_++] : 0) % limit; }
  uint32_t next16(uint32_t limit) { return (next(256) << 8 | next(256)) % limit; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

const char* const kNames[] = {"x", "y", "", "xx", "w"};
const DType kDTypes[] = {DType::kUndefined, DType::kF32, DType::kF32, DType::kI64, DType::kF16, DType::kU8};

// A byte count: mostly whole rows (the case that runs), sometimes anything.
uint64_t byteCount(Bytes& in) {
  const uint64_t row = kFeatures * 4;
  switch (in.next(4)) {
    case 0: return in.next16(2048);
    case 1: return row * kBatch * (1 + in.next(4));
    default: return row * in.next(40);
  }
}

bool near(float got, float want) { return std::abs(got - want) <= 1e-4f * std::max(1.0f, std::abs(want)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Runners runners;
  Bytes in(data, size);
  const uint32_t mode = in.next(256);
  ModelRunner& runner = (mode & 1) != 0 ? *runners.rows : *runners.whole;
  const bool caller_outputs = (mode & 2) != 0;

  std::vector<std::vector<float>> buffers;
  buffers.reserve(8);
  InputMemoryView inputs;
  const float* x = nullptr;
  uint64_t x_bytes = 0;
  for (uint32_t n = in.next(3); n > 0; --n) {
    const std::string name = kNames[in.next(5)];
    const uint64_t bytes = byteCount(in);
    auto& buffer = buffers.emplace_back((bytes + 3) / 4);
    for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(in.next(16)) - 4.0f + 0.25f * (i % 7);
    const bool null = in.next(16) == 0;
    inputs[name] = ConstTensorMemoryView{null ? nullptr : buffer.data(), bytes, kDTypes[in.next(6)]};
    if (name == "x" && !null) {
      x = buffer.data();
      x_bytes = bytes;
    }
  }
  OutputMemoryView outputs;
  float* y = nullptr;
  uint64_t y_bytes = 0;
  if (caller_outputs) {
    for (uint32_t n = in.next(3); n > 0; --n) {
      const std::string name = kNames[in.next(5)];
      const uint64_t bytes = byteCount(in);
      auto& buffer = buffers.emplace_back((bytes + 3) / 4, -7.0f);
      const bool null = in.next(16) == 0;
      outputs[name] = TensorMemoryView{null ? nullptr : buffer.data(), bytes, kDTypes[in.next(6)]};
      if (name == "y" && !null) {
        y = buffer.data();
        y_bytes = bytes;
      }
    }
  }

  std::vector<float> got;
  try {
    if (caller_outputs) {
      runner.executeAsync(inputs, outputs).get();
      if (y == nullptr || y_bytes != x_bytes) std::abort();  // accepted without a matching output
      got.assign(y, y + y_bytes / 4);
    } else {
      OutputTensors result = runner.executeAsync(inputs).get();
      const HostTensor& tensor = result.at("y");
      got.resize(tensor.bytes.size() / 4);
      std::memcpy(got.data(), tensor.bytes.data(), tensor.bytes.size());
    }
  } catch (const UsageError&) {
    return 0;  // refused: fine, whatever the request was
  }
  // Accepted: it must have been a real request, and the answer right.
  if (x == nullptr || x_bytes == 0 || x_bytes % (kFeatures * 4) != 0 || got.size() * 4 != x_bytes) std::abort();
  for (size_t r = 0; r < got.size() / kFeatures; ++r) {
    for (int64_t j = 0; j < kFeatures; ++j) {
      float want = static_cast<float>(j);
      for (int64_t i = 0; i < kFeatures; ++i) want += x[r * kFeatures + i] * weight(i, j);
      if (!near(got[r * kFeatures + j], want)) std::abort();
    }
  }
  return 0;
}
