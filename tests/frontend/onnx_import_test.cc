// ONNX import on real model files written with the ONNX protobuf classes.
#include "kiln/onnx_import.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <fstream>

#include "frontend/onnx/onnx_tensor.h"
#include "kiln/error.h"
#include "tests/format/test_package.h"

namespace kiln {
namespace {

using testing::TempDir;

void addInput(onnx::GraphProto& graph, const std::string& name, int elem_type, const std::vector<std::string>& dims) {
  onnx::ValueInfoProto* input = graph.add_input();
  input->set_name(name);
  auto* tensor = input->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(elem_type);
  auto* shape = tensor->mutable_shape();
  for (const std::string& dim : dims) {
    auto* d = shape->add_dim();
    if (!dim.empty() && std::isdigit(static_cast<unsigned char>(dim[0]))) {
      d->set_dim_value(std::stoll(dim));
    } else if (!dim.empty()) {
      d->set_dim_param(dim);
    }
  }
}

onnx::NodeProto* addNode(onnx::GraphProto& graph, const std::string& op, const std::vector<std::string>& inputs,
                         const std::vector<std::string>& outputs) {
  onnx::NodeProto* node = graph.add_node();
  node->set_op_type(op);
  node->set_name(op + "_" + outputs.front());
  for (const auto& i : inputs) node->add_input(i);
  for (const auto& o : outputs) node->add_output(o);
  return node;
}

onnx::TensorProto floatTensor(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v,
                              bool raw) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  if (raw) {
    t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  } else {
    for (float f : v) t.add_float_data(f);
  }
  return t;
}

onnx::ModelProto modelWith(onnx::GraphProto graph) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("kiln-test");
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  *model.mutable_graph() = std::move(graph);
  return model;
}

// x[batch, 4] -> MatMul(w) -> Add(b) -> Relu -> y; w as raw data, b typed.
onnx::ModelProto mlp(const std::string& batch_dim = "batch") {
  onnx::GraphProto g;
  g.set_name("mlp");
  addInput(g, "x", onnx::TensorProto::FLOAT, {batch_dim, "4"});
  *g.add_initializer() = floatTensor("w", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}, true);
  *g.add_initializer() = floatTensor("b", {2}, {0.5f, -0.5f}, false);
  addNode(g, "MatMul", {"x", "w"}, {"mm"});
  addNode(g, "Add", {"mm", "b"}, {"sum"});
  addNode(g, "Relu", {"sum"}, {"y"});
  g.add_output()->set_name("y");
  return modelWith(g);
}

std::filesystem::path save(const onnx::ModelProto& model, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary);
  model.SerializeToOstream(&out);
  return path;
}

std::string importError(const std::filesystem::path& path, const OnnxImportOptions& options = {}) {
  try {
    (void)importOnnx(path, options);
  } catch (const GraphError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(OnnxImport, ImportsAnMlpWithInitializers) {
  TempDir dir;
  const OnnxModel model = importOnnx(save(mlp("1"), dir / "mlp.onnx"));
  const Graph& g = *model.graph;
  EXPECT_EQ(model.opsets.at(""), 17);
  EXPECT_EQ(model.ir_version, 8);
  EXPECT_EQ(g.name(), "mlp");
  EXPECT_EQ(g.nodeIds().size(), 3u);
  EXPECT_EQ(g.value(g.inputs()[0]).type.toString(), "f32[1, 4]");
  const Value& w = g.value(*g.findValue("w"));
  ASSERT_EQ(w.kind, ValueKind::kInitializer);
  EXPECT_EQ(w.initializer->info, (TensorInfo{DType::kF32, {4, 2}}));
  float w7 = 0;
  std::memcpy(&w7, w.initializer->bytes.data() + 7 * sizeof(float), sizeof(float));
  EXPECT_EQ(w7, 8.0f);
  const Value& b = g.value(*g.findValue("b"));
  float b1 = 0;
  std::memcpy(&b1, b.initializer->bytes.data() + sizeof(float), sizeof(float));
  EXPECT_EQ(b1, -0.5f);
  EXPECT_EQ(g.node(g.nodeIds()[2]).name, "Relu_y");
  EXPECT_EQ(g.value(g.outputs()[0]).name, "y");
}

std::string inputType(const OnnxModel& model) { return model.graph->value(model.graph->inputs()[0]).type.toString(); }

TEST(OnnxImport, DynamicDimensionsMustBeFixed) {
  TempDir dir;
  const auto path = save(mlp(), dir / "mlp.onnx");
  EXPECT_NE(importError(path).find("input 'x' dimension 0 ('batch') is not fixed: give it with --shape x:DIMS or "
                                   "--batch N"),
            std::string::npos)
      << importError(path);
  OnnxImportOptions batch;
  batch.batch = 8;
  EXPECT_EQ(inputType(importOnnx(path, batch)), "f32[8, 4]");
  OnnxImportOptions shape;
  shape.input_shapes["x"] = {3, 4};
  EXPECT_EQ(inputType(importOnnx(path, shape)), "f32[3, 4]");
  shape.input_shapes["x"] = {3, 5};
  EXPECT_NE(importError(path, shape).find("sets dimension 1 to 5, but the model fixes it to 4"), std::string::npos);
  shape.input_shapes["x"] = {3};
  EXPECT_NE(importError(path, shape).find("has rank 1, but the model's input has rank 2"), std::string::npos);
  shape.input_shapes = {{"nope", {1}}};
  EXPECT_NE(importError(path, shape).find("--shape names 'nope', which is not an input of the model (inputs: x)"),
            std::string::npos);
  OnnxImportOptions dynamic;
  dynamic.require_static_inputs = false;
  EXPECT_EQ(inputType(importOnnx(path, dynamic)), "f32[batch, 4]");
}

TEST(OnnxImport, NodesAreSortedByDependencies) {
  TempDir dir;
  onnx::ModelProto model = mlp("1");
  auto* nodes = model.mutable_graph()->mutable_node();
  nodes->SwapElements(0, 2);  // Relu first, MatMul last
  const OnnxModel imported = importOnnx(save(model, dir / "unsorted.onnx"));
  const Graph& g = *imported.graph;
  std::vector<std::string> order;
  for (NodeId id : g.topologicalOrder()) order.push_back(g.node(id).op_type);
  EXPECT_EQ(order, (std::vector<std::string>{"MatMul", "Add", "Relu"}));
}

TEST(OnnxImport, MalformedModelsGetClearErrors) {
  TempDir dir;
  {
    onnx::ModelProto model = mlp("1");
    model.mutable_graph()->mutable_node(1)->set_input(0, "ghost");
    EXPECT_NE(importError(save(model, dir / "a.onnx")).find("node 'Add_sum' (Add) reads 'ghost', which no node, input "
                                                            "or initializer defines"),
              std::string::npos);
  }
  {
    onnx::ModelProto model = mlp("1");
    model.mutable_graph()->mutable_node(0)->set_input(0, "y");  // MatMul reads Relu's output: a cycle
    EXPECT_NE(importError(save(model, dir / "b.onnx")).find("has a cycle through nodes"), std::string::npos);
  }
  {
    onnx::ModelProto model = mlp("1");
    model.mutable_graph()->mutable_initializer(0)->set_raw_data("short");
    EXPECT_NE(importError(save(model, dir / "c.onnx")).find("tensor 'w': holds 5 bytes of data but"),
              std::string::npos);
    // Empty raw data: its copy was handed a null pointer (UBSan, onnx_import_fuzz).
    model.mutable_graph()->mutable_initializer(0)->set_raw_data("");
    EXPECT_NE(importError(save(model, dir / "c0.onnx")).find("tensor 'w': holds 0 bytes of data but"),
              std::string::npos);
  }
  {
    onnx::ModelProto model = mlp("1");
    model.mutable_graph()->mutable_initializer(1)->set_data_type(onnx::TensorProto::STRING);
    EXPECT_NE(importError(save(model, dir / "d.onnx")).find("ONNX data type 8, which kiln does not support"),
              std::string::npos);
  }
  {
    onnx::ModelProto model = mlp("1");
    model.mutable_graph()->mutable_output(0)->set_name("nothing");
    EXPECT_NE(importError(save(model, dir / "e.onnx")).find("graph output 'nothing' is not defined"),
              std::string::npos);
  }
  {
    onnx::ModelProto model = mlp("1");
    model.clear_opset_import();
    EXPECT_NE(importError(save(model, dir / "f.onnx")).find("imports no version of the default ONNX operator set"),
              std::string::npos);
  }
  {
    onnx::ModelProto model = mlp("1");
    addNode(*model.mutable_graph(), "Neg", {"x"}, {"mm"});  // 'mm' defined twice
    EXPECT_NE(importError(save(model, dir / "g.onnx")).find("value 'mm' is defined twice"), std::string::npos);
  }
  {
    onnx::ModelProto model = mlp("1");
    onnx::NodeProto* constant = model.mutable_graph()->add_node();  // found by fuzzing: no output
    constant->set_op_type("Constant");
    auto* value = constant->add_attribute();
    value->set_name("value_int");
    value->set_type(onnx::AttributeProto::INT);
    EXPECT_NE(importError(save(model, dir / "h.onnx")).find("needs exactly one value attribute and one output"),
              std::string::npos);
  }
  {
    std::ofstream(dir / "junk.onnx") << "this is not a protobuf \xff\xff\xff\xff";
    EXPECT_NE(importError(dir / "junk.onnx").find("not a valid ONNX model"), std::string::npos);
  }
  EXPECT_THROW(importOnnx(dir / "missing.onnx"), IoError);
}

TEST(OnnxImport, ExternalDataIsReadFromTheModelsDirectoryOnly) {
  TempDir dir;
  const std::vector<float> weights = {1, 2, 3, 4, 5, 6, 7, 8};
  {
    std::ofstream out(dir / "weights.bin", std::ios::binary);
    out << "PAD!";  // the data starts at offset 4
    out.write(reinterpret_cast<const char*>(weights.data()), sizeof(float) * weights.size());
  }
  auto external = [&](const std::string& location) {
    onnx::ModelProto model = mlp("1");
    onnx::TensorProto* w = model.mutable_graph()->mutable_initializer(0);
    w->clear_raw_data();
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const std::string& key, const std::string& value) {
      auto* entry = w->add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    };
    add("location", location);
    add("offset", "4");
    add("length", "32");
    return model;
  };
  const OnnxModel model = importOnnx(save(external("weights.bin"), dir / "ext.onnx"));
  const Value& w = model.graph->value(*model.graph->findValue("w"));
  EXPECT_EQ(std::memcmp(w.initializer->bytes.data(), weights.data(), 32), 0);
  EXPECT_NE(importError(save(external("../weights.bin"), dir / "up.onnx")).find("must be a relative path inside"),
            std::string::npos);
  EXPECT_NE(importError(save(external("/etc/passwd"), dir / "abs.onnx")).find("must be a relative path inside"),
            std::string::npos);
  EXPECT_NE(importError(save(external("absent.bin"), dir / "absent.onnx")).find("is missing or not a regular file"),
            std::string::npos);
}

TEST(OnnxImport, IfBranchesReadEnclosingValues) {
  TempDir dir;
  onnx::GraphProto g;
  g.set_name("main");
  addInput(g, "x", onnx::TensorProto::FLOAT, {"2"});
  addInput(g, "cond", onnx::TensorProto::BOOL, {});
  addNode(g, "Relu", {"x"}, {"r"});
  auto branch = [](const std::string& name, const std::string& op) {
    onnx::GraphProto body;
    body.set_name(name);
    addNode(body, op, {"r"}, {name + "_out"});  // reads the parent's 'r'
    body.add_output()->set_name(name + "_out");
    return body;
  };
  onnx::NodeProto* node = addNode(g, "If", {"cond"}, {"y"});
  auto* then_branch = node->add_attribute();
  then_branch->set_name("then_branch");
  then_branch->set_type(onnx::AttributeProto::GRAPH);
  *then_branch->mutable_g() = branch("then", "Neg");
  auto* else_branch = node->add_attribute();
  else_branch->set_name("else_branch");
  else_branch->set_type(onnx::AttributeProto::GRAPH);
  *else_branch->mutable_g() = branch("else", "Abs");
  g.mutable_node()->SwapElements(0, 1);  // If before the Relu it depends on through its branches
  g.add_output()->set_name("y");
  const OnnxModel model = importOnnx(save(modelWith(g), dir / "if.onnx"));
  const Graph& main = *model.graph;
  const std::vector<NodeId> order = main.topologicalOrder();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(main.node(order[0]).op_type, "Relu");
  const Node& if_node = main.node(order[1]);
  ASSERT_EQ(if_node.subgraphs().size(), 2u);
  const Graph& else_graph = *if_node.subgraphs()[0];  // attributes are kept sorted by name
  ASSERT_EQ(else_graph.outerScopeValues().size(), 1u);
  EXPECT_EQ(else_graph.value(else_graph.outerScopeValues()[0]).name, "r");
  EXPECT_TRUE(findGraphProblems(main).empty());
}

TEST(OnnxImport, ModelsMayImportOnlyOtherDomains) {
  TempDir dir;
  onnx::GraphProto g;
  g.set_name("ml");
  addInput(g, "x", onnx::TensorProto::FLOAT, {"2"});
  addNode(g, "Binarizer", {"x"}, {"y"})->set_domain("ai.onnx.ml");
  g.add_output()->set_name("y");
  onnx::ModelProto model = modelWith(g);
  model.mutable_opset_import(0)->set_domain("ai.onnx.ml");
  model.mutable_opset_import(0)->set_version(1);
  const OnnxModel imported = importOnnx(save(model, dir / "ml.onnx"));
  EXPECT_EQ(imported.opsets.count(""), 0u);
  EXPECT_EQ(imported.opsets.at("ai.onnx.ml"), 1);
  // A default-domain node still needs the default opset.
  addNode(*model.mutable_graph(), "Relu", {"y"}, {"z"});
  EXPECT_NE(importError(save(model, dir / "relu.onnx"))
                .find("node 'Relu_z' (Relu) is in the default ONNX domain, but the model imports no version"),
            std::string::npos);
}

TEST(OnnxImport, FlexAttentionModifiersAreInlined) {
  TempDir dir;
  onnx::GraphProto g;
  g.set_name("flex");
  for (const char* name : {"q", "k", "v"}) addInput(g, name, onnx::TensorProto::FLOAT, {"1", "2", "3", "4"});
  onnx::NodeProto* node = addNode(g, "FlexAttention", {"q", "k", "v"}, {"y"});
  node->set_domain("ai.onnx.preview");
  auto modifier = [](const std::string& name, const std::string& op) {
    onnx::GraphProto body;
    body.set_name(name);
    addInput(body, "in", onnx::TensorProto::FLOAT, {"B", "H", "L", "S"});
    *body.add_initializer() = floatTensor("c", {}, {0.5f}, false);
    addNode(body, op, {"in", "c"}, {"out"});
    body.add_output()->set_name("out");
    return body;
  };
  for (const auto& [name, op] : {std::pair{"score_mod", "Add"}, {"prob_mod", "Mul"}}) {
    auto* attribute = node->add_attribute();
    attribute->set_name(name);
    attribute->set_type(onnx::AttributeProto::GRAPH);
    *attribute->mutable_g() = modifier(name, op);
  }
  g.add_output()->set_name("y");
  onnx::ModelProto model = modelWith(g);
  auto* preview = model.add_opset_import();
  preview->set_domain("ai.onnx.preview");
  preview->set_version(1);
  const OnnxModel imported = importOnnx(save(model, dir / "flex.onnx"));
  const Graph& main = *imported.graph;
  std::vector<std::string> ops;
  for (NodeId id : main.topologicalOrder()) ops.push_back(main.node(id).domain + ":" + main.node(id).op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"kiln:FlexAttentionScores", ":Add", ":Softmax", ":Mul", "kiln:FlexAttentionOutput"}));
  EXPECT_EQ(main.value(main.outputs()[0]).name, "y");
  EXPECT_EQ(std::get<int64_t>(main.node(main.topologicalOrder().back()).attributes.at("softmax")), 0);
  EXPECT_TRUE(findGraphProblems(main).empty());
}

TEST(OnnxImport, ConstantNodesBecomeInitializers) {
  TempDir dir;
  onnx::GraphProto g;
  g.set_name("c");
  addInput(g, "x", onnx::TensorProto::FLOAT, {"2", "6"});
  onnx::NodeProto* shape = addNode(g, "Constant", {}, {"shape"});
  auto* value = shape->add_attribute();
  value->set_name("value_ints");
  value->set_type(onnx::AttributeProto::INTS);
  value->add_ints(3);
  value->add_ints(4);
  onnx::NodeProto* scale = addNode(g, "Constant", {}, {"scale"});
  auto* tensor = scale->add_attribute();
  tensor->set_name("value");
  tensor->set_type(onnx::AttributeProto::TENSOR);
  *tensor->mutable_t() = floatTensor("", {}, {2.5f}, true);
  addNode(g, "Reshape", {"x", "shape"}, {"r"});
  addNode(g, "Mul", {"r", "scale"}, {"y"});
  g.add_output()->set_name("y");
  const OnnxModel model = importOnnx(save(modelWith(g), dir / "c.onnx"));
  const Graph& graph = *model.graph;
  EXPECT_EQ(graph.nodeIds().size(), 2u);
  const Value& shape_value = graph.value(*graph.findValue("shape"));
  ASSERT_EQ(shape_value.kind, ValueKind::kInitializer);
  EXPECT_EQ(shape_value.initializer->info, (TensorInfo{DType::kI64, {2}}));
  EXPECT_EQ(graph.value(*graph.findValue("scale")).initializer->info, (TensorInfo{DType::kF32, {}}));
}

// ONNX packs 4-bit elements two to a byte, 2-bit ones four, the first in the
// low bits; kiln keeps one element per byte.
TEST(OnnxImport, SubByteTensorsAreUnpackedOnePerByte) {
  const onnx_import::ModelSource source{"m.onnx", {}, {}};
  // ONNX codes (kiln's copy of onnx.proto predates some of their names).
  constexpr int kInt4 = 22, kUint2 = 25, kFloat4E2M1 = 23, kFloat8E4M3Fnuz = 18;
  auto bytesOf = [](const ConstantPtr& c) {
    std::vector<int> out;
    for (std::byte b : c->bytes) out.push_back(static_cast<int>(b));
    return out;
  };
  onnx::TensorProto int4;
  int4.set_name("w");
  int4.set_data_type(kInt4);
  int4.add_dims(3);
  int4.set_raw_data(std::string("\x8F\x07", 2));  // -1, -8, 7 (and a zero pad nibble)
  ConstantPtr c = onnx_import::constantFromTensorProto(int4, source);
  EXPECT_EQ(c->info, (TensorInfo{DType::kI4, {3}}));
  EXPECT_EQ(bytesOf(c), (std::vector<int>{0xF, 0x8, 0x7}));

  int4.clear_raw_data();
  int4.add_int32_data(0x8F);  // int32_data holds the same packed bytes, one per entry
  int4.add_int32_data(0x07);
  EXPECT_EQ(bytesOf(onnx_import::constantFromTensorProto(int4, source)), (std::vector<int>{0xF, 0x8, 0x7}));

  onnx::TensorProto uint2;
  uint2.set_name("u");
  uint2.set_data_type(kUint2);
  uint2.add_dims(5);
  uint2.set_raw_data(std::string("\xE4\x02", 2));  // 0, 1, 2, 3 | 2
  EXPECT_EQ(bytesOf(onnx_import::constantFromTensorProto(uint2, source)), (std::vector<int>{0, 1, 2, 3, 2}));

  onnx::TensorProto f4;
  f4.set_name("f");
  f4.set_data_type(kFloat4E2M1);
  f4.add_dims(2);
  f4.add_dims(2);
  f4.set_raw_data(std::string("\x21\x7F", 2));
  c = onnx_import::constantFromTensorProto(f4, source);
  EXPECT_EQ(c->info, (TensorInfo{DType::kF4E2M1, {2, 2}}));
  EXPECT_EQ(bytesOf(c), (std::vector<int>{0x1, 0x2, 0xF, 0x7}));

  uint2.set_raw_data(std::string("\xE4", 1));  // 5 elements need 2 bytes
  try {
    onnx_import::constantFromTensorProto(uint2, source);
    ADD_FAILURE() << "no error";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 1 bytes of data"), std::string::npos) << e.what();
  }

  onnx::TensorProto fnuz;
  fnuz.set_name("z");
  fnuz.set_data_type(kFloat8E4M3Fnuz);
  fnuz.add_dims(2);
  fnuz.add_int32_data(0x80);
  fnuz.add_int32_data(0x40);
  EXPECT_EQ(bytesOf(onnx_import::constantFromTensorProto(fnuz, source)), (std::vector<int>{0x80, 0x40}));
}

TEST(OnnxImport, ParseDims) {
  EXPECT_EQ(parseDims("1x3x224x224"), (std::vector<int64_t>{1, 3, 224, 224}));
  EXPECT_EQ(parseDims("7"), (std::vector<int64_t>{7}));
  EXPECT_THROW(parseDims(""), UsageError);
  EXPECT_THROW(parseDims("1x"), UsageError);
  EXPECT_THROW(parseDims("1x-3"), UsageError);
  EXPECT_THROW(parseDims("2y3"), UsageError);
}

}  // namespace
}  // namespace kiln
