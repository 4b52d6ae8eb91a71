#include "kernels/cpu/window_attributes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/error.h"

namespace kiln {

std::vector<int64_t> sizedInts(std::string_view op, const ParamMap& params, const std::string& name, size_t size,
                               int64_t minimum, const std::vector<int64_t>& fallback) {
  std::vector<int64_t> values = params.getInts(name, fallback);
  if (values.size() != size) {
    throw UsageError(fmt::format("{}: attribute '{}' has {} values, {} expected", op, name, values.size(), size));
  }
  for (int64_t v : values) {
    if (v < minimum) {
      throw UsageError(fmt::format("{}: attribute '{}' [{}] has the value {}; at least {} expected", op, name,
                                   fmt::join(values, ", "), v, minimum));
    }
  }
  return values;
}

}  // namespace kiln
