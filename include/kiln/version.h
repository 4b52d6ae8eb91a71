// The kiln release this build is: the one version number of the library,
// the C API (kiln_version()), `kiln --version`, the Python package and the
// producer string written into every blob header. CMakeLists.txt reads
// KILN_VERSION from this file (project(VERSION), the shared libraries'
// SONAME, kilnConfigVersion.cmake, kiln.pc). Semantic versioning: see
// CHANGELOG.md.
#pragma once

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 2
#define KILN_VERSION_PATCH 0
#define KILN_VERSION "0.2.0"

#ifdef __cplusplus
#include <string_view>

namespace kiln {

inline constexpr std::string_view kKilnVersion = KILN_VERSION;
inline constexpr std::string_view kProducer = "kiln " KILN_VERSION;

}  // namespace kiln
#endif
