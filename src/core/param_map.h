// ParamMap: the attributes of one compiled step (a node's attributes as the
// kernel sees them), stored in the executable and handed to the kernel when
// it is prepared. Plain values only: ints, floats, strings and lists.
//
// Encoding (inside an executable): u32 count, then per entry, sorted by key:
// string key, u8 kind, value (i64 | f64 | string | list<i64> | list<f64> |
// list<string>).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/byte_io.h"

namespace kiln {

using ParamValue = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
                                std::vector<std::string>>;

class ParamMap {
 public:
  void set(const std::string& key, ParamValue value) { values_[key] = std::move(value); }
  bool has(const std::string& key) const { return values_.contains(key); }

  // The value, or `fallback` when absent; UsageError when of another kind.
  int64_t getInt(const std::string& key, int64_t fallback) const;
  double getFloat(const std::string& key, double fallback) const;
  std::string getString(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> getInts(const std::string& key, const std::vector<int64_t>& fallback) const;
  std::vector<double> getFloats(const std::string& key, const std::vector<double>& fallback) const;
  std::vector<std::string> getStrings(const std::string& key, const std::vector<std::string>& fallback) const;

  const std::map<std::string, ParamValue>& values() const { return values_; }
  void encode(ByteWriter& out) const;
  static ParamMap decode(ByteCursor& in);

  friend bool operator==(const ParamMap&, const ParamMap&) = default;

 private:
  std::map<std::string, ParamValue> values_;
};

}  // namespace kiln
