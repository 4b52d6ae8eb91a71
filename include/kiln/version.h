// The kiln release this build is; written into every blob header as the
// producer string.
#pragma once

#include <string_view>

namespace kiln {

inline constexpr std::string_view kKilnVersion = "0.1.0";
inline constexpr std::string_view kProducer = "kiln 0.1.0";

}  // namespace kiln
