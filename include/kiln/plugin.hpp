// kiln/plugin.hpp: a header-only C++ wrapper over the plugin ABI
// (kiln/plugin.h) for plugin authors. Nothing here is compiled into kiln;
// kiln only ever sees the C structs.
//
// An op is a class with:
//   explicit Op(const kiln::plugin::Attributes& attributes);  // once per node
//   void infer(std::span<const KilnTensorType> inputs, std::span<KilnTensorType> outputs) const;
//   void compute(std::span<const KilnTensor> inputs, std::span<KilnTensor> outputs,
//                std::span<std::byte> workspace) const;
// and optionally
//   uint64_t workspaceBytes(std::span<const KilnTensorType> inputs,
//                           std::span<const KilnTensorType> outputs) const;
//   KilnInputLayout inputLayout(int32_t input, std::span<const KilnTensorType> inputs) const;
//       the allocator hook (API level 2): how input `input` should lie in
//       memory; a zeroed KilnInputLayout for the inputs it has no wish for.
// Any of them may throw: the wrapper turns the exception into the ABI's
// error message, which kiln reports with the plugin's and op's names.
//
// A composite op instead has
//   std::vector<int32_t> build(kiln::plugin::Builder& body, std::span<const int32_t> inputs) const;
// which builds the op from operators kiln knows and returns its outputs' ids.
//
// A library registers its ops in one function:
//
//   KILN_PLUGIN_API_LEVEL_NEEDED(1);
//   KILN_PLUGIN_REGISTER(host) {
//     kiln::plugin::addOp<Rotate>(host, {.domain = "com.example", .name = "Rotate",
//                                        .min_inputs = 3, .max_inputs = 3, .min_outputs = 2, .max_outputs = 2});
//   }
//
// docs/plugins.md walks through a plugin from an empty folder.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "kiln/plugin.h"

#define KILN_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

// The API level the library needs (KILN_PLUGIN_API_LEVEL unless it uses
// nothing newer than an older level).
#define KILN_PLUGIN_API_LEVEL_NEEDED(level) KILN_PLUGIN_EXPORT const uint32_t kiln_plugin_api_level = (level)

// Defines kiln_plugin_register around a body that calls addOp; an
// exception thrown there becomes the registration's error.
#define KILN_PLUGIN_REGISTER(host)                                                                         \
  static void kilnPluginRegisterOps(const KilnPluginHost* host);                                          \
  KILN_PLUGIN_EXPORT int kiln_plugin_register(const KilnPluginHost* kiln_host, char* error, size_t capacity) { \
    return ::kiln::plugin::guarded(error, capacity, [&] { kilnPluginRegisterOps(kiln_host); });           \
  }                                                                                                        \
  static void kilnPluginRegisterOps(const KilnPluginHost* host)

namespace kiln::plugin {

// Thrown by the wrapper's helpers; any std::exception works the same.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs `body`; an exception becomes a message in `error` and a nonzero result.
template <typename Body>
int guarded(char* error, size_t capacity, Body&& body) noexcept {
  const char* message = nullptr;
  std::string text;
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    text = e.what();
    message = text.c_str();
  } catch (...) {
    message = "unknown exception";
  }
  if (error != nullptr && capacity > 0) std::snprintf(error, capacity, "%s", message);
  return 1;
}

// The node's attributes, parsed from kiln's JSON once, when the op's state
// is created. Values: numbers, strings, and lists of either.
class Attributes {
 public:
  using Value = std::variant<double, std::string, std::vector<double>, std::vector<std::string>>;

  // Parses one JSON object of such values; throws Error naming the column.
  explicit Attributes(const char* json) : text_(json == nullptr ? "" : json) {
    skipSpace();
    expect('{');
    skipSpace();
    if (peek() == '}') {
      ++at_;
    } else {
      for (;;) {
        skipSpace();
        std::string key = parseString();
        skipSpace();
        expect(':');
        skipSpace();
        values_[std::move(key)] = parseValue();
        skipSpace();
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skipSpace();
    if (at_ != text_.size()) fail("text after the object");
  }

  bool has(const std::string& key) const { return values_.count(key) != 0; }

  // The keys present, sorted (to refuse ones the op does not know).
  std::vector<std::string> keys() const {
    std::vector<std::string> result;
    for (const auto& entry : values_) result.push_back(entry.first);
    return result;
  }

  int64_t getInt(const std::string& key, int64_t fallback) const {
    const Value* value = find(key);
    if (value == nullptr) return fallback;
    const double* number = std::get_if<double>(value);
    if (number == nullptr) throw Error("attribute '" + key + "' is not an integer");
    return toInt(*number, key);
  }
  double getFloat(const std::string& key, double fallback) const {
    const Value* value = find(key);
    if (value == nullptr) return fallback;
    if (const double* number = std::get_if<double>(value)) return *number;
    throw Error("attribute '" + key + "' is not a number");
  }
  std::string getString(const std::string& key, const std::string& fallback) const {
    const Value* value = find(key);
    if (value == nullptr) return fallback;
    if (const std::string* text = std::get_if<std::string>(value)) return *text;
    throw Error("attribute '" + key + "' is not a string");
  }
  std::vector<double> getFloats(const std::string& key, const std::vector<double>& fallback) const {
    const Value* value = find(key);
    if (value == nullptr) return fallback;
    if (const auto* list = std::get_if<std::vector<double>>(value)) return *list;
    throw Error("attribute '" + key + "' is not a list of numbers");
  }
  std::vector<int64_t> getInts(const std::string& key, const std::vector<int64_t>& fallback) const {
    if (find(key) == nullptr) return fallback;
    std::vector<int64_t> result;
    for (double number : getFloats(key, {})) result.push_back(toInt(number, key));
    return result;
  }
  std::vector<std::string> getStrings(const std::string& key, const std::vector<std::string>& fallback) const {
    const Value* value = find(key);
    if (value == nullptr) return fallback;
    if (const auto* list = std::get_if<std::vector<std::string>>(value)) return *list;
    throw Error("attribute '" + key + "' is not a list of strings");
  }

 private:
  // A whole number in int64's range (JSON numbers arrive as doubles).
  static int64_t toInt(double number, const std::string& key) {
    if (!(number >= -9007199254740992.0 && number <= 9007199254740992.0) ||
        number != static_cast<double>(static_cast<int64_t>(number))) {
      throw Error("attribute '" + key + "' is not an integer (of at most 2^53 in magnitude)");
    }
    return static_cast<int64_t>(number);
  }
  const Value* find(const std::string& key) const {
    const auto it = values_.find(key);
    return it == values_.end() ? nullptr : &it->second;
  }
  [[noreturn]] void fail(const char* what) const {
    throw Error(std::string("attributes JSON, column ") + std::to_string(at_ + 1) + ": " + what);
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skipSpace() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t' || text_[at_] == '\r')) {
      ++at_;
    }
  }
  void expect(char c) {
    if (peek() != c) fail((std::string("expected '") + c + "'").c_str());
    ++at_;
  }
  std::string parseString() {
    expect('"');
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c == '\\') {
        if (at_ >= text_.size()) fail("unterminated escape");
        const char e = text_[at_++];
        switch (e) {
          case '"': case '\\': case '/': c = e; break;
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u': {
            if (at_ + 4 > text_.size()) fail("short \\u escape");
            const unsigned long code = std::strtoul(text_.substr(at_, 4).c_str(), nullptr, 16);
            at_ += 4;
            if (code >= 0x80) fail("\\u escapes above 0x7f are not supported");
            c = static_cast<char>(code);
            break;
          }
          default: fail("unknown escape");
        }
      }
      out.push_back(c);
    }
    expect('"');
    return out;
  }
  double parseNumber() {
    const char* begin = text_.c_str() + at_;
    char* end = nullptr;
    errno = 0;
    const double value = std::strtod(begin, &end);
    if (end == begin) fail("expected a value");
    at_ += static_cast<size_t>(end - begin);
    return value;
  }
  Value parseValue() {
    if (peek() == '"') return parseString();
    if (peek() != '[') return parseNumber();
    ++at_;
    skipSpace();
    if (peek() == ']') {
      ++at_;
      return std::vector<double>{};
    }
    if (peek() == '"') {
      std::vector<std::string> list;
      for (;;) {
        skipSpace();
        list.push_back(parseString());
        skipSpace();
        if (peek() != ',') break;
        ++at_;
      }
      expect(']');
      return list;
    }
    std::vector<double> list;
    for (;;) {
      skipSpace();
      list.push_back(parseNumber());
      skipSpace();
      if (peek() != ',') break;
      ++at_;
    }
    expect(']');
    return list;
  }

  std::string text_;
  size_t at_ = 0;
  std::map<std::string, Value> values_;
};

// Element counts and typed access for kernels.
inline uint64_t elementCount(const KilnTensor& tensor) {
  uint64_t n = 1;
  for (int32_t i = 0; i < tensor.rank; ++i) n *= static_cast<uint64_t>(tensor.dims[i]);
  return n;
}
// The same for a type (shape inference, allocator hooks): 0 when a
// dimension is unknown (KILN_DIM_UNKNOWN).
inline uint64_t elementCount(const KilnTensorType& type) {
  uint64_t n = 1;
  for (int32_t i = 0; i < type.rank; ++i) n *= type.dims[i] < 0 ? 0 : static_cast<uint64_t>(type.dims[i]);
  return n;
}
template <typename T>
T* data(const KilnTensor& tensor) {
  return static_cast<T*>(tensor.data);
}

// Attributes of the nodes a composite op builds.
inline KilnAttribute intAttribute(const char* name, int64_t value) {
  KilnAttribute a{};
  a.name = name;
  a.kind = KILN_ATTRIBUTE_INT;
  a.i = value;
  return a;
}
inline KilnAttribute floatAttribute(const char* name, double value) {
  KilnAttribute a{};
  a.name = name;
  a.kind = KILN_ATTRIBUTE_FLOAT;
  a.f = value;
  return a;
}
inline KilnAttribute stringAttribute(const char* name, const char* value) {
  KilnAttribute a{};
  a.name = name;
  a.kind = KILN_ATTRIBUTE_STRING;
  a.s = value;
  return a;
}
inline KilnAttribute intsAttribute(const char* name, const std::vector<int64_t>& values) {
  KilnAttribute a{};
  a.name = name;
  a.kind = KILN_ATTRIBUTE_INTS;
  a.count = static_cast<int32_t>(values.size());
  a.ints = values.data();  // `values` must outlive the add() call
  return a;
}

// A composite op's body, built through kiln's KilnGraphBuilder: values are
// ids, the op's inputs first.
class Builder {
 public:
  explicit Builder(const KilnGraphBuilder* builder) : builder_(builder) {}

  // A node of an operator kiln knows (domain "" for ONNX's); its outputs.
  std::vector<int32_t> node(const std::string& op_type, const std::vector<int32_t>& inputs,
                            const std::vector<KilnAttribute>& attributes = {}, size_t outputs = 1,
                            const std::string& domain = "") {
    std::vector<int32_t> ids(outputs, -1);
    char error[512] = {0};
    if (builder_->add_node(builder_->context, domain.c_str(), op_type.c_str(), inputs.data(),
                           static_cast<int32_t>(inputs.size()), attributes.data(),
                           static_cast<int32_t>(attributes.size()), ids.data(), static_cast<int32_t>(outputs), error,
                           sizeof error) != 0) {
      throw Error(error);
    }
    return ids;
  }
  // The one output of a node.
  int32_t add(const std::string& op_type, const std::vector<int32_t>& inputs,
              const std::vector<KilnAttribute>& attributes = {}) {
    return node(op_type, inputs, attributes).front();
  }
  // A float32 scalar constant.
  int32_t constant(float value) {
    KilnTensorType type{};
    type.dtype = KILN_DTYPE_FLOAT;
    type.rank = 0;
    int32_t id = -1;
    char error[512] = {0};
    if (builder_->add_constant(builder_->context, &type, &value, &id, error, sizeof error) != 0) throw Error(error);
    return id;
  }

 private:
  const KilnGraphBuilder* builder_;
};

// What addOp registers besides the op's class.
struct OpSpec {
  const char* domain = nullptr;
  const char* name = nullptr;
  int32_t since_version = 1;
  int32_t until_version = 0;
  int32_t min_inputs = 1, max_inputs = 1;
  int32_t min_outputs = 1, max_outputs = 1;
  uint32_t num_inplace = 0;
  bool elementwise = false;
  bool stateless = false;
  // The gradient op (the reference's <op>_grad) and separate_gradients.
  const char* gradient_op = nullptr;
  bool separate_gradients = false;
};

namespace detail {

template <typename Op>
int create(const char* attributes, void** state, char* error, size_t capacity) {
  return guarded(error, capacity, [&] { *state = new Op(Attributes(attributes)); });
}
template <typename Op>
void destroy(void* state) {
  delete static_cast<Op*>(state);
}
template <typename Op>
int infer(const void* state, const KilnTensorType* inputs, int32_t input_count, KilnTensorType* outputs,
          int32_t output_count, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    static_cast<const Op*>(state)->infer(std::span<const KilnTensorType>(inputs, static_cast<size_t>(input_count)),
                                         std::span<KilnTensorType>(outputs, static_cast<size_t>(output_count)));
  });
}
template <typename Op>
uint64_t workspaceBytes(const void* state, const KilnTensorType* inputs, int32_t input_count,
                        const KilnTensorType* outputs, int32_t output_count) {
  try {
    return static_cast<const Op*>(state)->workspaceBytes(
        std::span<const KilnTensorType>(inputs, static_cast<size_t>(input_count)),
        std::span<const KilnTensorType>(outputs, static_cast<size_t>(output_count)));
  } catch (...) {
    return UINT64_MAX;  // kiln refuses it as a workspace it cannot plan
  }
}
template <typename Op>
int inputLayout(const void* state, int32_t input, const KilnTensorType* inputs, int32_t input_count,
                KilnInputLayout* layout, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    *layout = static_cast<const Op*>(state)->inputLayout(
        input, std::span<const KilnTensorType>(inputs, static_cast<size_t>(input_count)));
  });
}
template <typename Op>
int build(const void* state, const KilnGraphBuilder* builder, const int32_t* inputs, int32_t input_count,
          int32_t* outputs, int32_t output_count, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    Builder body(builder);
    const std::vector<int32_t> results = static_cast<const Op*>(state)->build(
        body, std::span<const int32_t>(inputs, static_cast<size_t>(input_count)));
    if (results.size() != static_cast<size_t>(output_count)) {
      throw Error("build returned " + std::to_string(results.size()) + " outputs for " + std::to_string(output_count));
    }
    for (size_t i = 0; i < results.size(); ++i) outputs[i] = results[i];
  });
}

template <typename Op>
int compute(const void* state, const KilnTensor* inputs, int32_t input_count, KilnTensor* outputs,
            int32_t output_count, void* workspace, uint64_t workspace_bytes, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    static_cast<const Op*>(state)->compute(std::span<const KilnTensor>(inputs, static_cast<size_t>(input_count)),
                                           std::span<KilnTensor>(outputs, static_cast<size_t>(output_count)),
                                           std::span<std::byte>(static_cast<std::byte*>(workspace),
                                                                static_cast<size_t>(workspace_bytes)));
  });
}

}  // namespace detail

// Registers `Op` with kiln; throws Error with kiln's message when refused.
template <typename Op>
void addOp(const KilnPluginHost* host, const OpSpec& spec) {
  KilnOp op{};
  op.struct_size = sizeof(KilnOp);
  op.domain = spec.domain;
  op.name = spec.name;
  op.since_version = spec.since_version;
  op.until_version = spec.until_version;
  op.min_inputs = spec.min_inputs;
  op.max_inputs = spec.max_inputs;
  op.min_outputs = spec.min_outputs;
  op.max_outputs = spec.max_outputs;
  op.num_inplace = spec.num_inplace;
  op.is_elementwise = spec.elementwise ? 1 : 0;
  op.is_stateless = spec.stateless ? 1 : 0;
  op.gradient_op = spec.gradient_op;
  op.separate_gradients = spec.separate_gradients ? 1 : 0;
  op.create = &detail::create<Op>;
  op.destroy = &detail::destroy<Op>;
  // A composite op has build(); a kernel op infer() and compute().
  if constexpr (requires(const Op& o, Builder& b, std::span<const int32_t> ids) { o.build(b, ids); }) {
    op.build = &detail::build<Op>;
  } else {
    op.infer = &detail::infer<Op>;
    op.compute = &detail::compute<Op>;
  }
  if constexpr (requires(const Op& o, std::span<const KilnTensorType> t) { o.workspaceBytes(t, t); }) {
    op.workspace_bytes = &detail::workspaceBytes<Op>;
  }
  if constexpr (requires(const Op& o, std::span<const KilnTensorType> t) { o.inputLayout(int32_t{0}, t); }) {
    // An older kiln would ignore the hook, and an op that reads its padding
    // would read past its inputs there: refuse to register instead.
    if (host->api_level < 2) {
      throw Error(std::string(spec.name) + " has an allocator hook, which needs kiln's plugin API level 2 (this kiln "
                  "has " + std::to_string(host->api_level) + ")");
    }
    op.input_layout = &detail::inputLayout<Op>;
  }
  char error[512] = {0};
  if (host->register_op(host->context, &op, error, sizeof error) != 0) throw Error(error);
}

}  // namespace kiln::plugin
