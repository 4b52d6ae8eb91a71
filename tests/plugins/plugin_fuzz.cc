// Fuzzes what crosses the plugin boundary into kiln or a plugin:
//   input 'J' + text: the attributes JSON reader of kiln/plugin.hpp, which
//       plugins run on the attributes kiln hands them (from any model): it
//       must return or throw kiln::plugin::Error, and every accessor must
//       too, whatever the text;
//   any other input: one KilnOp made from the bytes (struct_size, version
//       range, counts, metadata and the domain and name strings from the
//       input; every pointer field, function or string, set to something
//       valid or null by a bit each, as a plugin's are) through kiln's
//       registration checks (refusalOf), which must accept or refuse it,
//       never read past its struct_size or crash.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/plugin.hpp"
#include "plugins/plugin_registry.h"

namespace {

int infer(const void*, const KilnTensorType*, int32_t, KilnTensorType*, int32_t, char*, size_t) { return 0; }
int compute(const void*, const KilnTensor*, int32_t, KilnTensor*, int32_t, void*, uint64_t, char*, size_t) { return 0; }
int create(const char*, void**, char*, size_t) { return 0; }
void destroy(void*) {}
uint64_t workspace(const void*, const KilnTensorType*, int32_t, const KilnTensorType*, int32_t) { return 0; }
int build(const void*, const KilnGraphBuilder*, const int32_t*, int32_t, int32_t*, int32_t, char*, size_t) { return 0; }
int layout(const void*, int32_t, const KilnTensorType*, int32_t, KilnInputLayout*, char*, size_t) { return 0; }

void fuzzAttributes(const std::string& text) {
  try {
    const kiln::plugin::Attributes attributes(text.c_str());
    for (const std::string& key : attributes.keys()) {
      // Each accessor on each key: a value or an Error, never anything else.
      try { (void)attributes.getInt(key, 0); } catch (const kiln::plugin::Error&) {}
      try { (void)attributes.getFloat(key, 0); } catch (const kiln::plugin::Error&) {}
      try { (void)attributes.getString(key, ""); } catch (const kiln::plugin::Error&) {}
      try { (void)attributes.getInts(key, {}); } catch (const kiln::plugin::Error&) {}
      try { (void)attributes.getFloats(key, {}); } catch (const kiln::plugin::Error&) {}
      try { (void)attributes.getStrings(key, {}); } catch (const kiln::plugin::Error&) {}
    }
  } catch (const kiln::plugin::Error&) {
  }
}

void fuzzOp(const uint8_t* data, size_t size) {
  // The struct's bytes: as many as the input gives, the rest zero.
  KilnOp op;
  std::memset(&op, 0, sizeof op);
  std::memcpy(&op, data, std::min(size, sizeof op));
  const size_t rest = size > sizeof op ? size - sizeof op : 0;
  // Strings from what follows the struct: "domain\0name".
  const std::string tail(reinterpret_cast<const char*>(data) + (size - rest), rest);
  const size_t split = tail.find('\0');
  const std::string domain = tail.substr(0, split);
  const std::string name = split == std::string::npos ? std::string() : tail.substr(split + 1);
  const uint32_t bits = static_cast<uint32_t>(op.min_inputs) ^ op.num_inplace;
  op.domain = (bits & 1) ? nullptr : domain.c_str();
  op.name = (bits & 2) ? nullptr : name.c_str();
  op.infer = (bits & 4) ? nullptr : &infer;
  op.compute = (bits & 8) ? nullptr : &compute;
  op.create = (bits & 16) ? nullptr : &create;
  op.destroy = (bits & 32) ? nullptr : &destroy;
  op.workspace_bytes = (bits & 64) ? nullptr : &workspace;
  op.build = (bits & 128) ? nullptr : &build;
  op.gradient_op = (bits & 256) ? nullptr : name.c_str();
  op.input_layout = (bits & 512) ? nullptr : &layout;
  op.op_data = nullptr;
  // struct_size as given (any value): kiln must read at most that much of
  // the struct, and never beyond its own KilnOp.
  (void)kiln::refusalOf(&op);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] == 'J') {
    fuzzAttributes(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  } else {
    fuzzOp(data, size);
  }
  return 0;
}
