// The HTTP inference body codec (server/http_codec.h): JSON and binary
// tensor data in, JSON and binary out, and the errors bad bodies get.
#include "server/http_codec.h"

#include <cstring>
#include <gtest/gtest.h>

#include "server/status.h"

namespace kiln::server {
namespace {

std::string floatsBytes(std::initializer_list<float> values) {
  std::string bytes(values.size() * 4, '\0');
  std::memcpy(bytes.data(), values.begin(), bytes.size());
  return bytes;
}

// The ServerError message of parsing `body`, or "" when it parses.
std::string parseError(const std::string& body, std::optional<size_t> header_length = std::nullopt,
                       HttpLimits limits = {}) {
  try {
    parseInferRequest(body, header_length, "m", "1", limits);
    return "";
  } catch (const ServerError& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    return e.what();
  }
}

TEST(HttpCodec, ParsesJsonTensorsNestedOrFlat) {
  const std::string body = R"({"id": "r1", "inputs": [
      {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3.5, -4]]},
      {"name": "b", "datatype": "INT64", "shape": [3], "data": [1, -2, 9007199254740993]},
      {"name": "c", "datatype": "BOOL", "shape": [2], "data": [true, false]}],
      "outputs": [{"name": "y", "parameters": {"binary_data": true}}, {"name": "z"}]})";
  const InferRequest request = parseInferRequest(body, std::nullopt, "m", "1");
  EXPECT_EQ(request.id, "r1");
  ASSERT_EQ(request.inputs.size(), 3u);
  EXPECT_EQ(request.inputs[0].data, floatsBytes({1, 2, 3.5f, -4}));
  int64_t b[3];
  ASSERT_EQ(request.inputs[1].data.size(), sizeof(b));
  std::memcpy(b, request.inputs[1].data.data(), sizeof(b));
  EXPECT_EQ(b[2], 9007199254740993);  // exact: no trip through double
  EXPECT_EQ(request.inputs[2].data, std::string("\x01\x00", 2));
  ASSERT_EQ(request.outputs.size(), 2u);
  EXPECT_TRUE(request.outputs[0].binary);
  EXPECT_FALSE(request.outputs[1].binary);
}

TEST(HttpCodec, ParsesBinaryTensorData) {
  const std::string header =
      R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
                    {"name": "b", "datatype": "FP32", "shape": [1], "data": [7]}],
          "parameters": {"binary_data_output": true}})";
  const std::string body = header + floatsBytes({1.5f, 2.5f});
  const InferRequest request = parseInferRequest(body, header.size(), "m", "1");
  EXPECT_EQ(request.inputs[0].data, floatsBytes({1.5f, 2.5f}));
  EXPECT_EQ(request.inputs[0].data.data(), body.data() + header.size());  // no copy
  EXPECT_EQ(request.inputs[1].data, floatsBytes({7}));
  EXPECT_TRUE(request.binary_outputs);
}

TEST(HttpCodec, RefusesBadBodiesWithTheirReason) {
  EXPECT_NE(parseError("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(parseError("[]").find("JSON object"), std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": 3})").find("\"inputs\" array"), std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]})").find("\"name\""),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [{"name": "a", "datatype": "STRANGE", "shape": [1], "data": [1]}]})")
                .find("not one kiln serves"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [{"name": "a", "datatype": "INT8", "shape": [1], "data": [300]}]})")
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [{"name": "a", "datatype": "UINT8", "shape": [1], "data": [-1]}]})")
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1, 2, 3]}]})")
                .find("more data elements"),
            std::string::npos);
  EXPECT_NE(parseError(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1000, 1000], "data": [1]}]})",
                       std::nullopt, HttpLimits{1000})
                .find("more than 1000 elements"),
            std::string::npos);
  const std::string header =
      R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]})";
  EXPECT_NE(parseError(header + "1234", header.size()).find("only 4 bytes"), std::string::npos);
  EXPECT_NE(parseError(header + "123456789", header.size()).find("no input claims"), std::string::npos);
  EXPECT_NE(parseError(header, header.size() + 1).find("Inference-Header-Content-Length"), std::string::npos);
  EXPECT_NE(parseError(header).find("no Inference-Header-Content-Length"), std::string::npos);
}

TEST(HttpCodec, EncodesJsonAndBinaryOutputs) {
  InferResponse response;
  response.model_name = "m";
  response.model_version = "2";
  response.id = "q";
  response.outputs.push_back({"y", "FP32", {2}, floatsBytes({1, -2}), false});
  response.outputs.push_back({"z", "FP32", {1}, floatsBytes({3}), true});
  const EncodedResponse encoded = encodeInferResponse(response);
  ASSERT_TRUE(encoded.header_length.has_value());
  const std::string json = encoded.body.substr(0, *encoded.header_length);
  EXPECT_NE(json.find(R"("data":[1.0,-2.0])"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("binary_data_size":4)"), std::string::npos) << json;
  EXPECT_EQ(encoded.body.substr(*encoded.header_length), floatsBytes({3}));

  response.outputs.pop_back();
  EXPECT_FALSE(encodeInferResponse(response).header_length.has_value());
}

}  // namespace
}  // namespace kiln::server
