// JSON string escaping, shared by the traces (runtime) and the attributes
// handed to plugins (passes). include/kiln/step_trace.h declares the same
// function for users.
#pragma once

#include <string>

namespace kiln {

// `text` as the contents of a JSON string (quotes, backslashes and control
// characters escaped).
std::string jsonEscape(const std::string& text);

}  // namespace kiln
