#include "ir/graph_codec.h"

#include <fmt/format.h>

#include <cstring>

#include "core/byte_io.h"
#include "kiln/error.h"

namespace kiln {
namespace {

// ------------------------------------------------------------- encoding

void encodeType(ByteWriter& out, const ValueType& type) {
  out.u8(static_cast<uint8_t>(type.dtype));
  out.u8(type.shape ? 1 : 0);
  if (!type.shape) return;
  out.u32(static_cast<uint32_t>(type.shape->size()));
  for (const Dim& dim : *type.shape) {
    out.i64(dim.size);
    out.string(dim.symbol);
  }
}

void encodeConstant(ByteWriter& out, const Constant& constant) {
  out.u8(static_cast<uint8_t>(constant.info.dtype));
  out.u32(static_cast<uint32_t>(constant.info.shape.size()));
  for (int64_t dim : constant.info.shape) out.i64(dim);
  out.u64(constant.bytes.size());
  out.raw(constant.bytes.data(), constant.bytes.size());
}

void encodeGraphBody(ByteWriter& out, const Graph& graph, const std::function<bool(const Value&)>& keep_out);

void encodeAttribute(ByteWriter& out, const Attribute& attribute) {
  out.u8(static_cast<uint8_t>(attribute.index()));
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          out.i64(value);
        } else if constexpr (std::is_same_v<T, float>) {
          out.raw(&value, sizeof(float));
        } else if constexpr (std::is_same_v<T, std::string>) {
          out.string(value);
        } else if constexpr (std::is_same_v<T, ConstantPtr>) {
          encodeConstant(out, *value);
        } else if constexpr (std::is_same_v<T, GraphPtr>) {
          encodeGraphBody(out, *value, {});
        } else {
          out.u32(static_cast<uint32_t>(value.size()));
          for (const auto& item : value) {
            using Item = std::decay_t<decltype(item)>;
            if constexpr (std::is_same_v<Item, int64_t>) out.i64(item);
            else if constexpr (std::is_same_v<Item, float>) out.raw(&item, sizeof(float));
            else if constexpr (std::is_same_v<Item, std::string>) out.string(item);
            else if constexpr (std::is_same_v<Item, ConstantPtr>) encodeConstant(out, *item);
            else encodeGraphBody(out, *item, {});
          }
        }
      },
      attribute);
}

void encodeGraphBody(ByteWriter& out, const Graph& graph, const std::function<bool(const Value&)>& keep_out) {
  out.string(graph.name());
  auto namedTypes = [&](const std::vector<ValueId>& ids) {
    out.u32(static_cast<uint32_t>(ids.size()));
    for (ValueId id : ids) {
      out.string(graph.value(id).name);
      encodeType(out, graph.value(id).type);
    }
  };
  namedTypes(graph.inputs());
  namedTypes(graph.outerScopeValues());
  out.u32(static_cast<uint32_t>(graph.initializers().size()));
  for (ValueId id : graph.initializers()) {
    const Value& value = graph.value(id);
    out.string(value.name);
    const bool external = keep_out && keep_out(value);
    out.u8(external ? 1 : 0);
    if (!external) encodeConstant(out, *value.initializer);
  }
  const std::vector<NodeId> order = graph.topologicalOrder();
  out.u32(static_cast<uint32_t>(order.size()));
  for (NodeId id : order) {
    const Node& node = graph.node(id);
    out.string(node.op_type);
    out.string(node.domain);
    out.string(node.name);
    out.u32(static_cast<uint32_t>(node.inputs.size()));
    for (ValueId input : node.inputs) out.string(input == kNoValue ? "" : graph.value(input).name);
    namedTypes(node.outputs);
    out.u32(static_cast<uint32_t>(node.attributes.size()));
    for (const auto& [key, attribute] : node.attributes) {
      out.string(key);
      encodeAttribute(out, attribute);
    }
  }
  out.u32(static_cast<uint32_t>(graph.outputs().size()));
  for (ValueId id : graph.outputs()) out.string(graph.value(id).name);
}

// ------------------------------------------------------------- decoding

class GraphDecoder {
 public:
  GraphDecoder(ByteCursor& in, const std::function<ConstantPtr(const std::string&)>& resolve)
      : in_(in), resolve_(resolve) {}

  GraphPtr graph(int depth) {
    if (depth > 64) in_.fail("subgraphs nested more than 64 deep");
    auto graph = std::make_shared<Graph>(in_.string("graph name"));
    for (uint32_t i = 0, n = in_.count("inputs", 6); i < n; ++i) {
      const std::string name = in_.string("input name");
      graph->addInput(name, type());
    }
    for (uint32_t i = 0, n = in_.count("outer scope values", 6); i < n; ++i) {
      const std::string name = in_.string("outer scope value name");
      graph->addOuterScopeValue(name, type());
    }
    for (uint32_t i = 0, n = in_.count("initializers", 5); i < n; ++i) {
      const std::string name = in_.string("initializer name");
      const uint8_t kind = in_.u8("initializer kind");
      if (kind == 0) {
        graph->addInitializer(name, constant());
      } else if (kind == 1 && resolve_) {
        ConstantPtr data = resolve_(name);
        if (!data) in_.fail(fmt::format("initializer '{}' has no TensorData blob", name));
        graph->addInitializer(name, std::move(data));
      } else {
        in_.fail(fmt::format("initializer '{}' has kind {}", name, kind));
      }
    }
    for (uint32_t i = 0, n = in_.count("nodes", 16); i < n; ++i) node(*graph, depth);
    for (uint32_t i = 0, n = in_.count("outputs", 4); i < n; ++i) {
      const std::string name = in_.string("output name");
      const auto id = graph->findValue(name);
      if (!id) in_.fail(fmt::format("graph output '{}' is not defined", name));
      graph->addOutput(*id);
    }
    return graph;
  }

 private:
  DType dtype(std::string_view field) {
    const uint8_t code = in_.u8(field);
    if (code != 0 && !isValidDType(code)) in_.fail(fmt::format("{} has unknown dtype code {}", field, code));
    return static_cast<DType>(code);
  }

  ValueType type() {
    ValueType type;
    type.dtype = dtype("value dtype");
    if (in_.u8("has shape") == 0) return type;
    std::vector<Dim> dims(in_.count("rank", 12));
    if (dims.size() > kMaxRank) in_.fail(fmt::format("rank {} is more than {}", dims.size(), kMaxRank));
    for (Dim& dim : dims) {
      dim.size = in_.i64("dimension");
      dim.symbol = in_.string("dimension symbol");
      if (dim.size < kDynamicDim) in_.fail(fmt::format("dimension {} is negative", dim.size));
    }
    type.shape = std::move(dims);
    return type;
  }

  ConstantPtr constant() {
    TensorInfo info;
    info.dtype = dtype("constant dtype");
    // Undefined has no element size: 2^62 such elements would fit in 0 bytes.
    if (info.dtype == DType::kUndefined) in_.fail("a constant has no dtype (code 0)");
    const uint32_t rank = in_.count("constant rank", 8);
    if (rank > kMaxRank) in_.fail(fmt::format("constant rank {} is more than {}", rank, kMaxRank));
    for (uint32_t i = 0; i < rank; ++i) {
      info.shape.push_back(in_.i64("constant dimension"));
      if (info.shape.back() < 0) in_.fail("a constant dimension is negative");
    }
    const uint64_t size = in_.u64("constant size");
    const auto stored = in_.bytes(size, "constant bytes");
    std::vector<std::byte> bytes(stored.begin(), stored.end());
    try {
      return makeConstant(info, std::move(bytes));
    } catch (const Error& e) {
      in_.fail(e.what());
    }
  }

  float f32(std::string_view field) {
    const uint32_t bits = in_.u32(field);
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  Attribute attribute(int depth) {
    const uint8_t kind = in_.u8("attribute kind");
    switch (kind) {
      case 0: return in_.i64("int attribute");
      case 1: return f32("float attribute");
      case 2: return in_.string("string attribute");
      case 3: return constant();
      case 4: return graph(depth + 1);
      case 5: return list<int64_t>([&] { return in_.i64("ints attribute"); }, 8);
      case 6: return list<float>([&] { return f32("floats attribute"); }, 4);
      case 7: return list<std::string>([&] { return in_.string("strings attribute"); }, 4);
      case 8: return list<ConstantPtr>([&] { return constant(); }, 13);
      case 9: return list<GraphPtr>([&] { return graph(depth + 1); }, 20);
      default: in_.fail(fmt::format("attribute kind {} is unknown", kind));
    }
  }

  template <typename T, typename Read>
  std::vector<T> list(Read read, size_t min_item_size) {
    std::vector<T> items(in_.count("attribute list", min_item_size));
    for (T& item : items) item = read();
    return items;
  }

  void node(Graph& graph, int depth) {
    const std::string op = in_.string("op type");
    const std::string domain = in_.string("domain");
    const std::string name = in_.string("node name");
    std::vector<ValueId> inputs;
    for (uint32_t i = 0, n = in_.count("node inputs", 4); i < n; ++i) {
      const std::string input = in_.string("node input");
      if (input.empty()) {
        inputs.push_back(kNoValue);
        continue;
      }
      const auto id = graph.findValue(input);
      if (!id) in_.fail(fmt::format("node '{}' reads '{}' before it is defined", name, input));
      inputs.push_back(*id);
    }
    std::vector<std::string> output_names;
    std::vector<ValueType> output_types;
    for (uint32_t i = 0, n = in_.count("node outputs", 6); i < n; ++i) {
      output_names.push_back(in_.string("node output"));
      output_types.push_back(type());
    }
    Attributes attributes;
    for (uint32_t i = 0, n = in_.count("attributes", 5); i < n; ++i) {
      const std::string key = in_.string("attribute name");
      attributes[key] = attribute(depth);
    }
    const NodeId id = graph.addNode(op, inputs, output_names, std::move(attributes), domain);
    graph.node(id).name = name;
    for (size_t i = 0; i < output_types.size(); ++i) graph.value(graph.node(id).outputs[i]).type = output_types[i];
  }

  ByteCursor& in_;
  const std::function<ConstantPtr(const std::string&)>& resolve_;
};

}  // namespace

std::vector<std::byte> encodeGraph(const Graph& graph, const std::function<bool(const Value&)>& keep_out) {
  ByteWriter out;
  out.u32(kGraphCodecVersion);
  encodeGraphBody(out, graph, keep_out);
  return out.take();
}

Graph decodeGraph(std::span<const std::byte> bytes, const std::string& source,
                  const std::function<ConstantPtr(const std::string&)>& resolve) {
  ByteCursor in(bytes, source, 0);
  const uint32_t version = in.u32("graph codec version");
  if (version != kGraphCodecVersion) {
    in.fail(fmt::format("graph encoding version {} (this kiln reads version {})", version, kGraphCodecVersion));
  }
  GraphPtr graph;
  try {
    graph = GraphDecoder(in, resolve).graph(0);
  } catch (const FormatError&) {
    throw;
  } catch (const Error& e) {
    // The Graph's own checks (empty or repeated names, ...) on decoded data.
    throw FormatError(source, in.offset(), fmt::format("the stored graph is malformed: {}", e.what()));
  }
  if (in.remaining() != 0) in.fail(fmt::format("{} bytes after the graph", in.remaining()));
  const auto problems = findGraphProblems(*graph);
  if (!problems.empty()) throw FormatError(source, 0, "the stored graph is malformed: " + problems.front());
  return std::move(*graph);
}

}  // namespace kiln
