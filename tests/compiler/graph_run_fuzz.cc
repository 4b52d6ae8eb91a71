// libFuzzer target that compiles and runs small ONNX graphs (issue 12):
// the bytes choose up to eight operators from the table below (elementwise,
// comparisons, casts, shape and indexing operators, scatters, reductions,
// MatMul, Gemm, pools, Resize, Range, ConstantOfShape, the selections
// NonZero, Unique and Compress, ...), which values they read, their attributes
// and constant operands (shapes, axes, pads, indices: mostly small, some
// extreme: -1, 0, 2^31, 2^62, INT64_MIN), and the input tensors (small
// shapes, values with zeros, signs, infinities and NaN). Each graph goes
// through the whole compiler (type and shape inference, constant folding,
// fusion, memory plan) and runs on the Executor.
//
// Every graph is built twice from the same bytes: once with its inputs as
// graph inputs, run by the kernels (fused where the passes fuse), and once
// with them as initializers, so that constant folding computes what it can
// at compile time. Both must either refuse the graph with a kiln::Error or
// give the same outputs (exactly for integers and booleans, within 1e-4
// relative for floats), unless rounding alone may change them (an integer
// cast from a float a fused product computed: see Entry): folding must keep
// the kernels' semantics. Any
// other exception, a crash or a sanitizer report is a finding. (Both compile
// with fuse_clip off: a Clip fused into a product maps NaN to its min.)
//
// Not run (only compiled): graphs whose shapes are only known at run time,
// and plans over kMaxRunBytes, which docs/security.md leaves to resource
// limits.
//
// KILN_FUZZ_PRINT=1 prints each graph before it compiles: run the target on
// a crash input with it to see the graph that crashed.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kernels/evaluate_once.h"
#include "kernels/kernel.h"
#include "kiln/compiler.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "kiln/graph.h"
#include "kiln/log.h"

namespace {

using namespace kiln;

constexpr size_t kMaxNodes = 8;
constexpr uint64_t kMaxRunBytes = 1u << 20;  // bounds the work of a run under the sanitizers

struct Tensor {
  TensorInfo info;
  std::vector<std::byte> bytes;
};

// One output of a run: its shape and dtype, and its bytes.
using Outputs = std::vector<Tensor>;

// A value the graph builder may read, with the dtype it expects it to have
// (the compiler infers the real one; a wrong guess just makes a refusal).
//   computed  a float an operator computed: fused kernels (a product's
//             activation in oneDNN) may round it differently from the
//             unfused ones that constant folding runs, by an ulp or so;
//   fragile   a value that such a difference can change by more than the
//             float tolerance: made from a computed float by an operator
//             that rounds it to a discrete value (a Cast to int, a
//             comparison, OneHot's indices, Floor, ArgMax, ...), or
//             computed from a fragile value. Outputs that are fragile are
//             not compared (they are still compiled and run).
struct Entry {
  ValueId id;
  DType dtype;
  bool computed = false;
  bool fragile = false;
};

// Builds one graph from the fuzzer's bytes. Deterministic: the same bytes
// give the same graph whether inputs become graph inputs or initializers.
class GraphMaker {
 public:
  GraphMaker(const uint8_t* data, size_t size, bool inputs_as_constants)
      : in_(data, size), inputs_as_constants_(inputs_as_constants) {}

  // The graph, and the inputs' data in graph-input order.
  void build(Graph& graph, std::vector<Tensor>& inputs) {
    graph_ = &graph;
    const int input_count = in_.ConsumeIntegralInRange(1, 3);
    for (int i = 0; i < input_count; ++i) {
      Tensor tensor = makeTensor(pickDType());
      const std::string name = "in" + std::to_string(i);
      const ValueId id = inputs_as_constants_
                             ? graph.addInitializer(name, makeConstant(tensor.info, tensor.bytes))
                             : graph.addInput(name, ValueType::tensor(tensor.info.dtype, tensor.info.shape));
      pool_.push_back({id, tensor.info.dtype});
      if (!inputs_as_constants_) inputs.push_back(std::move(tensor));
    }
    const size_t nodes = in_.ConsumeIntegralInRange<size_t>(1, kMaxNodes);
    for (size_t n = 0; n < nodes && in_.remaining_bytes() > 0; ++n) addOperator();
    // The last value made, through an Identity so that an output is never
    // a graph input or an initializer itself.
    const Entry last = pool_.back();
    graph.addOutput(graph.node(graph.addNode("Identity", {last.id}, {"y"})).outputs[0]);
    output_fragile_ = last.fragile;
  }

  // Whether the output may differ between the two variants by rounding
  // alone (see Entry).
  bool outputFragile() const { return output_fragile_; }

 private:
  DType pickDType() {
    static constexpr DType kDTypes[] = {DType::kF32, DType::kF32, DType::kI64, DType::kBool};
    return kDTypes[in_.ConsumeIntegralInRange<size_t>(0, std::size(kDTypes) - 1)];
  }

  int64_t smallOrExtreme(int64_t low, int64_t high) {
    static constexpr int64_t kExtreme[] = {-1, 0, int64_t{1} << 31, int64_t{1} << 62, INT64_MIN, INT64_MAX};
    if (in_.ConsumeIntegralInRange(0, 15) == 0) return kExtreme[in_.ConsumeIntegralInRange<size_t>(0, 5)];
    return in_.ConsumeIntegralInRange(low, high);
  }

  std::vector<int64_t> ints(size_t max_count, int64_t low, int64_t high) {
    std::vector<int64_t> values(in_.ConsumeIntegralInRange<size_t>(0, max_count));
    for (int64_t& v : values) v = smallOrExtreme(low, high);
    return values;
  }

  Tensor makeTensor(DType dtype) {
    Tensor tensor;
    tensor.info.dtype = dtype;
    const int rank = in_.ConsumeIntegralInRange(0, 4);
    for (int i = 0; i < rank; ++i) tensor.info.shape.push_back(in_.ConsumeIntegralInRange(0, rank == 4 ? 3 : 4));
    const uint64_t count = tensor.info.numElements();
    tensor.bytes.resize(tensor.info.sizeInBytes());
    for (uint64_t i = 0; i < count; ++i) {
      if (dtype == DType::kF32) {
        static constexpr float kSpecial[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 1e30f, -1e30f, 1e-40f, INFINITY, -INFINITY, NAN};
        const float value = in_.ConsumeIntegralInRange(0, 5) == 0
                                ? kSpecial[in_.ConsumeIntegralInRange<size_t>(0, std::size(kSpecial) - 1)]
                                : static_cast<float>(in_.ConsumeIntegralInRange(-16, 16)) * 0.5f;
        std::memcpy(tensor.bytes.data() + 4 * i, &value, 4);
      } else if (dtype == DType::kI64) {
        const int64_t value = smallOrExtreme(-4, 4);
        std::memcpy(tensor.bytes.data() + 8 * i, &value, 8);
      } else {
        tensor.bytes[i] = static_cast<std::byte>(in_.ConsumeBool());
      }
    }
    return tensor;
  }

  // An operand: of dtype `want` three times in four when the pool has one.
  Entry operand(std::optional<DType> want = std::nullopt) {
    std::vector<Entry> matching;
    if (want) {
      for (const Entry& e : pool_) {
        if (e.dtype == *want) matching.push_back(e);
      }
    }
    const std::vector<Entry>& from = (!matching.empty() && in_.ConsumeIntegralInRange(0, 3) != 0) ? matching : pool_;
    return from[in_.ConsumeIntegralInRange<size_t>(0, from.size() - 1)];
  }

  ValueId intConstant(const std::vector<int64_t>& values, bool scalar = false) {
    std::vector<std::byte> bytes(values.size() * 8);
    if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    const TensorInfo info{DType::kI64, scalar ? std::vector<int64_t>{} : std::vector<int64_t>{int64_t(values.size())}};
    return graph_->addInitializer("c" + std::to_string(constants_++), makeConstant(info, std::move(bytes)));
  }

  ValueId scalarOf(DType dtype) {
    Tensor t{{dtype, {}}, {}};
    Tensor made = makeTensor(dtype);
    t.bytes.assign(made.bytes.begin(), made.bytes.end());
    t.bytes.resize(dtypeSize(dtype));
    return graph_->addInitializer("c" + std::to_string(constants_++), makeConstant(t.info, std::move(t.bytes)));
  }

  int64_t axis() { return smallOrExtreme(-3, 3); }

  void add(const std::string& op, const std::vector<ValueId>& operands, DType result, Attributes attributes = {},
           size_t outputs = 1) {
    std::vector<std::string> names(outputs);
    const NodeId node = graph_->addNode(op, operands, names, std::move(attributes));
    // Operators whose result jumps where a computed float crosses a
    // boundary; Shape and Size read no values.
    static const std::set<std::string> kDiscontinuous = {"Floor", "Ceil", "Sign", "Hardmax", "Mod",
                                                         "Unique", "TopK", "NonZero", "Compress"};
    bool fragile = false, rounds = false;
    for (ValueId id : operands) {
      for (const Entry& e : pool_) {
        if (e.id != id) continue;
        fragile |= e.fragile;
        rounds |= e.computed;
      }
    }
    if (rounds && op != "Shape" && op != "Size" && (result != DType::kF32 || kDiscontinuous.contains(op))) {
      fragile = true;
    }
    pool_.push_back({graph_->node(node).outputs[0], result, result == DType::kF32, fragile});
  }

  void addOperator() {
    static const char* const kUnary[] = {"Neg",  "Abs",   "Relu",       "Sigmoid", "Tanh",     "Exp",    "Log",
                                         "Sqrt", "Floor", "Ceil",       "Reciprocal", "Sign", "Identity", "Erf"};
    static const char* const kBinary[] = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"};
    static const char* const kCompare[] = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"};
    static const char* const kLogic[] = {"And", "Or", "Xor"};
    static const char* const kReduce[] = {"ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd"};
    auto pickOf = [&](const auto& names) { return std::string(names[in_.ConsumeIntegralInRange<size_t>(0, std::size(names) - 1)]); };
    const Entry a = operand();
    switch (in_.ConsumeIntegralInRange(0, 40)) {
      case 0: add(pickOf(kUnary), {a.id}, a.dtype); break;
      case 1: add("Not", {operand(DType::kBool).id}, DType::kBool); break;
      case 2: add(pickOf(kBinary), {a.id, operand(a.dtype).id}, a.dtype); break;
      case 3: add("Mod", {a.id, operand(a.dtype).id}, a.dtype, {{"fmod", int64_t{a.dtype == DType::kF32 || in_.ConsumeBool()}}}); break;
      case 4: add(pickOf(kCompare), {a.id, operand(a.dtype).id}, DType::kBool); break;
      case 5: add(pickOf(kLogic), {operand(DType::kBool).id, operand(DType::kBool).id}, DType::kBool); break;
      case 6: {
        const ValueId c = operand(DType::kBool).id;
        add("Where", {c, a.id, operand(a.dtype).id}, a.dtype);
        break;
      }
      case 7: {
        const DType to = pickDType();
        add("Cast", {a.id}, to, {{"to", int64_t{onnxTypeOf(to)}}});
        break;
      }
      case 8: {
        Attributes attributes;
        if (in_.ConsumeBool()) attributes["start"] = axis();
        if (in_.ConsumeBool()) attributes["end"] = axis();
        add("Shape", {a.id}, DType::kI64, attributes);
        break;
      }
      case 9: add("Size", {a.id}, DType::kI64); break;
      case 10: add("Reshape", {a.id, intConstant(ints(4, -1, 6))}, a.dtype, {{"allowzero", int64_t{in_.ConsumeBool()}}}); break;
      case 11: {
        std::vector<int64_t> perm(in_.ConsumeIntegralInRange<size_t>(0, 4));
        std::iota(perm.begin(), perm.end(), 0);
        for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[in_.ConsumeIntegralInRange<size_t>(0, i - 1)]);
        if (!perm.empty() && in_.ConsumeIntegralInRange(0, 7) == 0) perm[0] = axis();
        add("Transpose", {a.id}, a.dtype, {{"perm", perm}});
        break;
      }
      case 12: add("Flatten", {a.id}, a.dtype, {{"axis", axis()}}); break;
      case 13: add(in_.ConsumeBool() ? "Squeeze" : "Unsqueeze", {a.id, intConstant(ints(3, -3, 3))}, a.dtype); break;
      case 14: {
        std::vector<ValueId> parts{a.id};
        for (int i = in_.ConsumeIntegralInRange(1, 2); i > 0; --i) parts.push_back(operand(a.dtype).id);
        add("Concat", parts, a.dtype, {{"axis", axis()}});
        break;
      }
      case 15: {
        std::vector<ValueId> operands{a.id, intConstant(ints(3, -5, 5)), intConstant(ints(3, -5, 5))};
        if (in_.ConsumeBool()) operands.push_back(intConstant(ints(3, -3, 3)));
        if (operands.size() == 4 && in_.ConsumeBool()) operands.push_back(intConstant(ints(3, -2, 2)));
        add("Slice", operands, a.dtype);
        break;
      }
      case 16: {
        // Indices: constant, or any int64 value of the graph (read at run time).
        const ValueId indices = in_.ConsumeBool() ? intConstant(ints(4, -4, 4)) : operand(DType::kI64).id;
        add(in_.ConsumeBool() ? "Gather" : "GatherElements", {a.id, indices}, a.dtype, {{"axis", axis()}});
        break;
      }
      case 17: add("Expand", {a.id, intConstant(ints(4, 0, 4))}, a.dtype); break;
      case 18: add("Tile", {a.id, intConstant(ints(4, 0, 3))}, a.dtype); break;
      case 19: {
        static const char* const kModes[] = {"constant", "reflect", "edge"};
        add("Pad", {a.id, intConstant(ints(8, -2, 3))}, a.dtype, {{"mode", pickOf(kModes)}});
        break;
      }
      case 20: {
        Attributes attributes{{"keepdims", int64_t{in_.ConsumeBool()}}};
        if (in_.ConsumeBool()) {
          add("ReduceSum", {a.id, intConstant(ints(3, -3, 3))}, a.dtype, attributes);
        } else {
          if (in_.ConsumeBool()) attributes["axes"] = ints(3, -3, 3);
          add(pickOf(kReduce), {a.id}, a.dtype, attributes);
        }
        break;
      }
      case 21:
        add(in_.ConsumeBool() ? "ArgMax" : "ArgMin", {a.id}, DType::kI64,
            {{"axis", axis()}, {"keepdims", int64_t{in_.ConsumeBool()}}, {"select_last_index", int64_t{in_.ConsumeBool()}}});
        break;
      case 22: add("Softmax", {a.id}, a.dtype, {{"axis", axis()}}); break;
      case 23: add("CumSum", {a.id, intConstant({axis()}, true)}, a.dtype, {{"exclusive", int64_t{in_.ConsumeBool()}}, {"reverse", int64_t{in_.ConsumeBool()}}}); break;
      case 24: {
        const DType dtype = in_.ConsumeBool() ? DType::kI64 : DType::kF32;
        add("Range", {scalarOf(dtype), scalarOf(dtype), scalarOf(dtype)}, dtype);
        break;
      }
      case 25: add("ConstantOfShape", {intConstant(ints(3, 0, 4))}, DType::kF32); break;
      case 26: add("MatMul", {a.id, operand(a.dtype).id}, a.dtype); break;
      case 28: {
        std::vector<ValueId> operands{a.id, operand(a.dtype).id};
        if (in_.ConsumeBool()) operands.push_back(operand(a.dtype).id);
        add("Gemm", operands, a.dtype,
            {{"transA", int64_t{in_.ConsumeBool()}}, {"transB", int64_t{in_.ConsumeBool()}}, {"alpha", 0.5f}, {"beta", 2.0f}});
        break;
      }
      case 29: add("Split", {a.id, intConstant(ints(3, 0, 4))}, a.dtype, {{"axis", axis()}}, 2); break;
      case 30: {
        const ValueId indices = in_.ConsumeBool() ? intConstant(ints(4, -3, 3)) : operand(DType::kI64).id;
        add("GatherND", {a.id, indices}, a.dtype, {{"batch_dims", smallOrExtreme(0, 1)}});
        break;
      }
      case 31: {
        static const char* const kReductions[] = {"none", "add", "mul", "max", "min"};
        const ValueId indices = in_.ConsumeBool() ? intConstant(ints(4, -3, 3)) : operand(DType::kI64).id;
        add(in_.ConsumeBool() ? "ScatterElements" : "ScatterND", {a.id, indices, operand(a.dtype).id}, a.dtype,
            {{"axis", axis()}, {"reduction", pickOf(kReductions)}});
        break;
      }
      case 32: {
        std::vector<ValueId> operands{a.id};
        if (in_.ConsumeBool()) operands.push_back(intConstant({smallOrExtreme(-3, 3)}, true));
        add("Trilu", operands, a.dtype, {{"upper", int64_t{in_.ConsumeBool()}}});
        break;
      }
      case 33: {
        const ValueId depth = intConstant({smallOrExtreme(0, 5)}, true);
        add("OneHot", {a.id, depth, intConstant({0, 1})}, DType::kI64, {{"axis", axis()}});
        break;
      }
      case 34: {
        static const char* const kNorms[] = {"ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum"};
        Attributes attributes{{"keepdims", int64_t{in_.ConsumeBool()}}};
        if (in_.ConsumeBool()) attributes["axes"] = ints(3, -3, 3);
        add(pickOf(kNorms), {a.id}, a.dtype, attributes);
        break;
      }
      case 35: {
        static const char* const kPools[] = {"MaxPool", "AveragePool", "LpPool"};
        const std::vector<int64_t> kernel{smallOrExtreme(1, 3), smallOrExtreme(1, 3)};
        Attributes attributes{{"kernel_shape", kernel}, {"strides", ints(2, 1, 3)}, {"pads", ints(4, 0, 2)},
                              {"ceil_mode", int64_t{in_.ConsumeBool()}}};
        if (in_.ConsumeBool()) attributes["dilations"] = ints(2, 1, 2);
        add(pickOf(kPools), {a.id}, a.dtype, attributes);
        break;
      }
      case 36: add(in_.ConsumeBool() ? "DepthToSpace" : "SpaceToDepth", {a.id}, a.dtype, {{"blocksize", smallOrExtreme(1, 2)}}); break;
      case 37: {
        static const char* const kModes[] = {"nearest", "linear"};
        std::vector<float> scales(in_.ConsumeIntegralInRange<size_t>(1, 4));
        for (float& scale : scales) scale = 0.5f * static_cast<float>(in_.ConsumeIntegralInRange(1, 5));
        std::vector<std::byte> bytes(scales.size() * 4);
        std::memcpy(bytes.data(), scales.data(), bytes.size());
        const ValueId s = graph_->addInitializer(
            "c" + std::to_string(constants_++),
            makeConstant(TensorInfo{DType::kF32, {static_cast<int64_t>(scales.size())}}, std::move(bytes)));
        const ValueId none = graph_->addInitializer("c" + std::to_string(constants_++),
                                                    makeConstant(TensorInfo{DType::kF32, {0}}, {}));
        add("Resize", {a.id, none, s}, a.dtype, {{"mode", pickOf(kModes)}});
        break;
      }
      case 38: add(in_.ConsumeBool() ? "LogSoftmax" : "Hardmax", {a.id}, a.dtype, {{"axis", axis()}}); break;
      case 39: add(in_.ConsumeBool() ? "Sum" : "Mean", {a.id, operand(a.dtype).id, operand(a.dtype).id}, a.dtype); break;
      default: {
        switch (in_.ConsumeIntegralInRange(0, 4)) {
          case 0: add("Clip", {a.id, scalarOf(a.dtype), scalarOf(a.dtype)}, a.dtype); break;
          case 1:
            add("TopK", {a.id, intConstant({smallOrExtreme(0, 3)})}, a.dtype,
                {{"axis", axis()}, {"largest", int64_t{in_.ConsumeBool()}}, {"sorted", int64_t{1}}}, 2);
            break;
          // Selections: their output sizes depend on the values they read.
          case 2: add("NonZero", {a.id}, DType::kI64); break;
          case 3: {
            Attributes attributes{{"sorted", int64_t{in_.ConsumeBool()}}};
            if (in_.ConsumeBool()) attributes["axis"] = axis();
            add("Unique", {a.id}, a.dtype, attributes, in_.ConsumeIntegralInRange<size_t>(1, 4));
            break;
          }
          default: {
            Attributes attributes;
            if (in_.ConsumeBool()) attributes["axis"] = axis();
            add("Compress", {a.id, operand(DType::kBool).id}, a.dtype, attributes);
          }
        }
      }
    }
  }

  static int onnxTypeOf(DType dtype) {
    switch (dtype) {
      case DType::kF32: return 1;
      case DType::kI64: return 7;
      default: return 9;  // bool
    }
  }

  FuzzedDataProvider in_;
  bool inputs_as_constants_;
  Graph* graph_ = nullptr;
  std::vector<Entry> pool_;
  int constants_ = 0;
  bool output_fragile_ = false;
};

std::filesystem::path scratchPath(const char* variant) {
  const std::filesystem::path dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  return dir / ("kiln_graph_run_fuzz_" + std::to_string(::getpid()) + "_" + variant + ".kiln");
}

// Compiles and runs one variant: its outputs, or nullopt when kiln refused
// the graph (a kiln::Error) or it is not run (see the top of the file).
// *fragile: whether the output may differ by rounding alone (see Entry).
std::optional<Outputs> compileAndRun(const uint8_t* data, size_t size, bool inputs_as_constants, bool* fragile) {
  static const std::filesystem::path paths[] = {scratchPath("inputs"), scratchPath("constants")};
  const std::filesystem::path& path = paths[inputs_as_constants ? 1 : 0];
  Graph graph;
  std::vector<Tensor> inputs;
  try {
    GraphMaker maker(data, size, inputs_as_constants);
    maker.build(graph, inputs);
    *fragile = maker.outputFragile();
  } catch (const UsageError&) {
    return std::nullopt;  // a name or constant the builder made invalid; not kiln's concern
  }
  static const bool print = std::getenv("KILN_FUZZ_PRINT") != nullptr;
  if (print) std::fprintf(stderr, "%s\n", graph.toString().c_str());
  try {
    CompileOptions options;
    options.has_kernel = [](const std::string& name) { return KernelRegistry::cpu().find(name) != nullptr; };
    options.evaluate_kernel = &evaluateOnce;
    // A Clip fused into a oneDNN product maps NaN to its min (by design, as
    // in onnxruntime and OpenVINO: CompileOptions::fuse_clip), where folding
    // keeps ONNX's NaN; the fuzzer checks the NaN-exact compile.
    options.fuse_clip = false;
    const CompileReport report = compile(graph, {{"", 17}}, path, options);
    if (report.runtime_shapes || report.arena_bytes > kMaxRunBytes) return std::nullopt;
    Executor executor(path, "", ExecutorOptions{.threads = 1});
    std::vector<const std::byte*> in;
    for (const Tensor& tensor : inputs) in.push_back(tensor.bytes.data());
    Outputs outputs;
    std::vector<std::byte*> out;
    for (const TensorSlot& slot : executor.outputs()) {
      if (slot.info.sizeInBytes() > kMaxRunBytes) return std::nullopt;
      outputs.push_back({slot.info, std::vector<std::byte>(slot.info.sizeInBytes() + 1)});
    }
    for (Tensor& tensor : outputs) out.push_back(tensor.bytes.data());
    executor.run(in, out);
    for (Tensor& tensor : outputs) tensor.bytes.pop_back();
    return outputs;
  } catch (const Error&) {
    return std::nullopt;
  }
}

bool sameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;
  if (std::abs(a) > 1e30f && std::abs(b) > 1e30f) return std::signbit(a) == std::signbit(b);
  return std::abs(a - b) <= 1e-5f + 1e-4f * std::max(std::abs(a), std::abs(b));
}

// Aborts (a finding) when the kernels and constant folding disagree.
void expectSame(const Outputs& run, const Outputs& folded) {
  bool same = run.size() == folded.size();
  for (size_t i = 0; same && i < run.size(); ++i) {
    const Tensor& a = run[i];
    const Tensor& b = folded[i];
    if (a.info != b.info) {
      same = false;
    } else if (a.info.dtype == DType::kF32) {
      for (size_t k = 0; same && k < a.bytes.size() / 4; ++k) {
        float x, y;
        std::memcpy(&x, a.bytes.data() + 4 * k, 4);
        std::memcpy(&y, b.bytes.data() + 4 * k, 4);
        if (!sameFloat(x, y)) {
          std::fprintf(stderr, "output %zu element %zu: run %.9g, folded %.9g\n", i, k, double(x), double(y));
          same = false;
        }
      }
    } else {
      same = a.bytes == b.bytes;
    }
    if (!same) {
      std::fprintf(stderr, "output %zu: run %s %s, folded %s %s\n", i, std::string(dtypeName(a.info.dtype)).c_str(),
                   a.info.shapeString().c_str(), std::string(dtypeName(b.info.dtype)).c_str(), b.info.shapeString().c_str());
    }
  }
  if (!same) {
    std::fprintf(stderr, "the kernels and constant folding disagree\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    setLogLevel(LogLevel::kOff);
    return true;
  }();
  (void)quiet;
  bool fragile = false;
  const std::optional<Outputs> run = compileAndRun(data, size, false, &fragile);
  const std::optional<Outputs> folded = compileAndRun(data, size, true, &fragile);
  if (run && folded && !fragile) expectSame(*run, *folded);
  return 0;
}
