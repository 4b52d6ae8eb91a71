#include "core/param_map.h"

#include <fmt/format.h>

namespace kiln {
namespace {

template <typename T>
T get(const std::map<std::string, ParamValue>& values, const std::string& key, const T& fallback,
      std::string_view kind) {
  const auto it = values.find(key);
  if (it == values.end()) return fallback;
  if (const T* value = std::get_if<T>(&it->second)) return *value;
  throw UsageError(fmt::format("parameter '{}' is not {}", key, kind));
}

}  // namespace

int64_t ParamMap::getInt(const std::string& key, int64_t fallback) const { return get(values_, key, fallback, "an int"); }
double ParamMap::getFloat(const std::string& key, double fallback) const {
  return get(values_, key, fallback, "a float");
}
std::string ParamMap::getString(const std::string& key, const std::string& fallback) const {
  return get(values_, key, fallback, "a string");
}
std::vector<int64_t> ParamMap::getInts(const std::string& key, const std::vector<int64_t>& fallback) const {
  return get(values_, key, fallback, "a list of ints");
}
std::vector<double> ParamMap::getFloats(const std::string& key, const std::vector<double>& fallback) const {
  return get(values_, key, fallback, "a list of floats");
}
std::vector<std::string> ParamMap::getStrings(const std::string& key, const std::vector<std::string>& fallback) const {
  return get(values_, key, fallback, "a list of strings");
}

void ParamMap::encode(ByteWriter& out) const {
  out.u32(static_cast<uint32_t>(values_.size()));
  for (const auto& [key, value] : values_) {
    out.string(key);
    out.u8(static_cast<uint8_t>(value.index()));
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            out.i64(v);
          } else if constexpr (std::is_same_v<T, double>) {
            out.raw(&v, sizeof v);
          } else if constexpr (std::is_same_v<T, std::string>) {
            out.string(v);
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            out.u32(static_cast<uint32_t>(v.size()));
            for (const std::string& item : v) out.string(item);
          } else {
            out.u32(static_cast<uint32_t>(v.size()));
            for (const auto& item : v) out.raw(&item, sizeof item);
          }
        },
        value);
  }
}

ParamMap ParamMap::decode(ByteCursor& in) {
  ParamMap map;
  const uint32_t count = in.count("parameters", 4 + 1);
  for (uint32_t i = 0; i < count; ++i) {
    std::string key = in.string("parameter key");
    const uint64_t kind_at = in.offset();
    switch (in.u8("parameter kind")) {
      case 0: map.set(key, in.i64("int parameter")); break;
      case 1: {
        const uint64_t bits = in.u64("float parameter");
        double value;
        std::memcpy(&value, &bits, sizeof value);
        map.set(key, value);
        break;
      }
      case 2: map.set(key, in.string("string parameter")); break;
      case 3: {
        std::vector<int64_t> list(in.count("int list", 8));
        for (int64_t& v : list) v = in.i64("int list item");
        map.set(key, std::move(list));
        break;
      }
      case 4: {
        std::vector<double> list(in.count("float list", 8));
        for (double& v : list) {
          const uint64_t bits = in.u64("float list item");
          std::memcpy(&v, &bits, sizeof v);
        }
        map.set(key, std::move(list));
        break;
      }
      case 5: {
        std::vector<std::string> list(in.count("string list", 4));
        for (std::string& v : list) v = in.string("string list item");
        map.set(key, std::move(list));
        break;
      }
      default: in.failAt(kind_at, "unknown parameter kind");
    }
  }
  return map;
}

}  // namespace kiln
