// Attribute reading shared by the sliding-window kernels (conv.cc, pool.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/param_map.h"

namespace kiln {

// The int list attribute `name`, which must have `size` values, each at
// least `minimum`; `fallback` when absent. Throws UsageError naming `op`.
std::vector<int64_t> sizedInts(std::string_view op, const ParamMap& params, const std::string& name, size_t size,
                               int64_t minimum, const std::vector<int64_t>& fallback);

}  // namespace kiln
