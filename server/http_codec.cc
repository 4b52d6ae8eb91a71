#include "server/http_codec.h"

#include <cstring>
#include <limits>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/datatype.h"
#include "server/status.h"
#include "src/core/float_formats.h"

namespace kiln::server {
namespace {

using nlohmann::json;

ServerError invalid(const std::string& message) { return ServerError(StatusCode::kInvalidArgument, message); }

// Appends the elements of a (possibly nested) JSON array, row-major.
void flatten(const json& value, std::vector<const json*>& out, uint64_t limit, const std::string& input) {
  if (value.is_array()) {
    for (const json& item : value) flatten(item, out, limit, input);
  } else {
    if (out.size() >= limit) throw invalid(fmt::format("input '{}': more data elements than its shape holds", input));
    out.push_back(&value);
  }
}

template <typename T>
void writeInteger(const json& v, char* dst, const std::string& input, size_t index) {
  if (v.is_boolean()) {
    const T x = v.get<bool>() ? 1 : 0;
    std::memcpy(dst, &x, sizeof(T));
    return;
  }
  if (!v.is_number_integer()) throw invalid(fmt::format("input '{}': element {} is not an integer", input, index));
  bool fits;
  T x{};
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    fits = u <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    x = static_cast<T>(u);
  } else {
    const int64_t s = v.get<int64_t>();
    fits = std::is_signed_v<T> ? (s >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                  s <= static_cast<int64_t>(std::numeric_limits<T>::max()))
                               : (s >= 0 && static_cast<uint64_t>(s) <= static_cast<uint64_t>(std::numeric_limits<T>::max()));
    x = static_cast<T>(s);
  }
  if (!fits) throw invalid(fmt::format("input '{}': element {} is out of range for its datatype", input, index));
  std::memcpy(dst, &x, sizeof(T));
}

double number(const json& v, const std::string& input, size_t index) {
  if (!v.is_number()) throw invalid(fmt::format("input '{}': element {} is not a number", input, index));
  return v.get<double>();
}

// JSON elements into raw little-endian bytes of `dtype`.
std::vector<char> encodeElements(const std::vector<const json*>& elements, DType dtype, const std::string& input) {
  std::vector<char> bytes(elements.size() * dtypeSize(dtype));
  for (size_t i = 0; i < elements.size(); ++i) {
    const json& v = *elements[i];
    char* dst = bytes.data() + i * dtypeSize(dtype);
    switch (dtype) {
      case DType::kBool: {
        if (!v.is_boolean()) throw invalid(fmt::format("input '{}': element {} is not true or false", input, i));
        *dst = v.get<bool>() ? 1 : 0;
        break;
      }
      case DType::kU8: writeInteger<uint8_t>(v, dst, input, i); break;
      case DType::kU16: writeInteger<uint16_t>(v, dst, input, i); break;
      case DType::kU32: writeInteger<uint32_t>(v, dst, input, i); break;
      case DType::kU64: writeInteger<uint64_t>(v, dst, input, i); break;
      case DType::kI8: writeInteger<int8_t>(v, dst, input, i); break;
      case DType::kI16: writeInteger<int16_t>(v, dst, input, i); break;
      case DType::kI32: writeInteger<int32_t>(v, dst, input, i); break;
      case DType::kI64: writeInteger<int64_t>(v, dst, input, i); break;
      case DType::kF32: {
        const float x = static_cast<float>(number(v, input, i));
        std::memcpy(dst, &x, 4);
        break;
      }
      case DType::kF64: {
        const double x = number(v, input, i);
        std::memcpy(dst, &x, 8);
        break;
      }
      case DType::kF16: {
        const uint16_t x = floatToHalf(static_cast<float>(number(v, input, i)));
        std::memcpy(dst, &x, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t x = floatToBfloat16(static_cast<float>(number(v, input, i)));
        std::memcpy(dst, &x, 2);
        break;
      }
      default: throw invalid(fmt::format("input '{}': its datatype has no JSON form", input));
    }
  }
  return bytes;
}

template <typename T>
T load(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

// Raw elements into a flat JSON array.
json decodeElements(const std::string& data, DType dtype) {
  json array = json::array();
  const size_t size = dtypeSize(dtype);
  if (size == 0) return array;
  for (size_t at = 0; at + size <= data.size(); at += size) {
    const char* p = data.data() + at;
    switch (dtype) {
      case DType::kBool: array.push_back(*p != 0); break;
      case DType::kU8: array.push_back(load<uint8_t>(p)); break;
      case DType::kU16: array.push_back(load<uint16_t>(p)); break;
      case DType::kU32: array.push_back(load<uint32_t>(p)); break;
      case DType::kU64: array.push_back(load<uint64_t>(p)); break;
      case DType::kI8: array.push_back(load<int8_t>(p)); break;
      case DType::kI16: array.push_back(load<int16_t>(p)); break;
      case DType::kI32: array.push_back(load<int32_t>(p)); break;
      case DType::kI64: array.push_back(load<int64_t>(p)); break;
      case DType::kF32: array.push_back(load<float>(p)); break;
      case DType::kF64: array.push_back(load<double>(p)); break;
      case DType::kF16: array.push_back(halfToFloat(load<uint16_t>(p))); break;
      case DType::kBF16: array.push_back(bfloat16ToFloat(load<uint16_t>(p))); break;
      default: break;
    }
  }
  return array;
}

const json* parameter(const json& object, const char* name) {
  if (!object.is_object()) return nullptr;
  auto params = object.find("parameters");
  if (params == object.end()) return nullptr;
  if (!params->is_object()) throw invalid("\"parameters\" must be a JSON object");
  auto it = params->find(name);
  return it == params->end() ? nullptr : &*it;
}

std::string stringField(const json& object, const char* name, const std::string& where) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_string()) throw invalid(fmt::format("{} needs a string \"{}\"", where, name));
  return it->get<std::string>();
}

}  // namespace

InferRequest parseInferRequest(std::string_view body, std::optional<size_t> header_length,
                               const std::string& model_name, const std::string& model_version,
                               const HttpLimits& limits) {
  const size_t json_size = header_length.value_or(body.size());
  if (json_size > body.size()) {
    throw invalid(fmt::format("Inference-Header-Content-Length is {} but the body has only {} bytes", json_size,
                              body.size()));
  }
  json document;
  try {
    document = json::parse(body.substr(0, json_size));
  } catch (const json::exception& e) {
    throw invalid(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!document.is_object()) throw invalid("the request body must be a JSON object");

  InferRequest request;
  request.model_name = model_name;
  request.model_version = model_version;
  if (auto id = document.find("id"); id != document.end()) {
    if (!id->is_string()) throw invalid("\"id\" must be a string");
    request.id = id->get<std::string>();
  }
  if (const json* binary = parameter(document, "binary_data_output")) {
    if (!binary->is_boolean()) throw invalid("parameter \"binary_data_output\" must be true or false");
    request.binary_outputs = binary->get<bool>();
  }
  if (const json* timeout = parameter(document, "timeout")) {
    if (!timeout->is_number_integer() || timeout->get<int64_t>() < 0) {
      throw invalid("parameter \"timeout\" must be a number of microseconds >= 0");
    }
    request.deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(timeout->get<int64_t>());
  }

  auto inputs = document.find("inputs");
  if (inputs == document.end() || !inputs->is_array()) throw invalid("the request needs an \"inputs\" array");
  size_t binary_at = json_size;  // where the next binary blob starts
  for (const json& item : *inputs) {
    if (!item.is_object()) throw invalid("each of \"inputs\" must be a JSON object");
    InferInput input;
    input.name = stringField(item, "name", "an input");
    input.datatype = stringField(item, "datatype", fmt::format("input '{}'", input.name));
    auto shape = item.find("shape");
    if (shape == item.end() || !shape->is_array()) throw invalid(fmt::format("input '{}' needs a \"shape\" array", input.name));
    uint64_t elements = 1;
    for (const json& dim : *shape) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
        throw invalid(fmt::format("input '{}': shape dimensions must be integers >= 0", input.name));
      }
      input.shape.push_back(dim.get<int64_t>());
      const uint64_t d = static_cast<uint64_t>(input.shape.back());
      if (d != 0 && elements > limits.max_tensor_elements / d) {
        throw invalid(fmt::format("input '{}' has more than {} elements", input.name, limits.max_tensor_elements));
      }
      elements *= d;
    }
    const std::optional<DType> dtype = dtypeFromProtocol(input.datatype);
    if (!dtype) throw invalid(fmt::format("input '{}': datatype '{}' is not one kiln serves", input.name, input.datatype));
    if (const json* size = parameter(item, "binary_data_size")) {
      if (!size->is_number_integer() || size->get<int64_t>() < 0) {
        throw invalid(fmt::format("input '{}': binary_data_size must be an integer >= 0", input.name));
      }
      if (!header_length) {
        throw invalid(fmt::format("input '{}' has binary_data_size but the request has no "
                                  "Inference-Header-Content-Length header",
                                  input.name));
      }
      const uint64_t size_bytes = size->get<uint64_t>();
      if (size_bytes > body.size() - binary_at) {
        throw invalid(fmt::format("input '{}': binary_data_size is {} but only {} bytes of binary data are left",
                                  input.name, size_bytes, body.size() - binary_at));
      }
      input.data = body.substr(binary_at, size_bytes);
      binary_at += size_bytes;
    } else {
      auto data = item.find("data");
      if (data == item.end()) throw invalid(fmt::format("input '{}' has neither \"data\" nor binary_data_size", input.name));
      std::vector<const json*> flat;
      flatten(*data, flat, elements, input.name);
      if (flat.size() != elements) {
        throw invalid(fmt::format("input '{}' of shape [{}] needs {} data elements, the request gives {}", input.name,
                                  fmt::join(input.shape, ", "), elements, flat.size()));
      }
      request.storage.push_back(encodeElements(flat, *dtype, input.name));
      input.data = std::string_view(request.storage.back().data(), request.storage.back().size());
    }
    request.inputs.push_back(std::move(input));
  }
  if (binary_at != body.size()) {
    throw invalid(fmt::format("the body has {} bytes of binary data that no input claims", body.size() - binary_at));
  }

  if (auto outputs = document.find("outputs"); outputs != document.end()) {
    if (!outputs->is_array()) throw invalid("\"outputs\" must be an array");
    for (const json& item : *outputs) {
      if (!item.is_object()) throw invalid("each of \"outputs\" must be a JSON object");
      RequestedOutput output;
      output.name = stringField(item, "name", "a requested output");
      output.binary = request.binary_outputs;
      if (const json* binary = parameter(item, "binary_data")) {
        if (!binary->is_boolean()) throw invalid(fmt::format("output '{}': binary_data must be true or false", output.name));
        output.binary = binary->get<bool>();
      }
      if (parameter(item, "classification") != nullptr) {
        throw invalid(fmt::format("output '{}': the classification extension is not supported", output.name));
      }
      request.outputs.push_back(std::move(output));
    }
  }
  return request;
}

EncodedResponse encodeInferResponse(const InferResponse& response) {
  json document;
  document["model_name"] = response.model_name;
  document["model_version"] = response.model_version;
  if (!response.id.empty()) document["id"] = response.id;
  json outputs = json::array();
  bool any_binary = false;
  for (const InferOutput& output : response.outputs) {
    json item;
    item["name"] = output.name;
    item["datatype"] = output.datatype;
    item["shape"] = output.shape;
    if (output.binary) {
      item["parameters"]["binary_data_size"] = output.data.size();
      any_binary = true;
    } else {
      item["data"] = decodeElements(output.data, dtypeFromProtocol(output.datatype).value_or(DType::kUndefined));
    }
    outputs.push_back(std::move(item));
  }
  document["outputs"] = std::move(outputs);
  EncodedResponse encoded;
  encoded.body = document.dump(-1, ' ', false, json::error_handler_t::replace);
  if (any_binary) {
    encoded.header_length = encoded.body.size();
    size_t total = encoded.body.size();
    for (const InferOutput& output : response.outputs) total += output.binary ? output.data.size() : 0;
    encoded.body.reserve(total);
    for (const InferOutput& output : response.outputs) {
      if (output.binary) encoded.body.append(output.data);
    }
  }
  return encoded;
}

std::string errorBody(std::string_view message) {
  json document;
  document["error"] = message;
  return document.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kiln::server
