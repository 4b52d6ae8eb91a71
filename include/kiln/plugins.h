// Loading plugin libraries (custom operators, include/kiln/plugin.h) into
// this process. A loaded library's ops are known to compile() from then on,
// and a package that uses them records the library (file name, API level,
// content hash); loading such a package loads the library again by itself
// from KILN_PLUGIN_PATH or the package's folder (docs/plugins.md).
//
// Thread safety: loadPlugin may be called from any thread; libraries stay
// loaded until the process ends.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/plugin.h"

namespace kiln {

struct LoadedPlugin {
  std::string name;              // the file name packages refer to
  std::filesystem::path path;    // where it was loaded from
  uint32_t api_level = 0;        // the plugin API level it needs
  std::string hash;              // XXH3-64 of its bytes, 16 hex digits
  std::vector<std::string> ops;  // "com.example.Rotate", ...
};

// Loads the library at `path` (again: returns the one loaded). Throws
// UsageError: not found, not a kiln plugin (kiln_plugin_api_level or
// kiln_plugin_register missing), an API level above this kiln's (both
// named), an op refused at registration (the reason), another library of
// the same file name already loaded.
LoadedPlugin loadPlugin(const std::filesystem::path& path);

// The libraries loaded so far.
std::vector<LoadedPlugin> loadedPlugins();

// Registers a host function as an op of this process: a node of
// `op.domain`.`op.name` in a model then calls `op.compute` on the host in
// the middle of the program (on a device with its own memory, on the
// step's tensors in host memory). `op.op_data` is the function's state when
// it has no create(). The same checks as a library's ops (UsageError). A
// package that uses it records it; loading the package in a process that
// has not registered it fails when its step is prepared.
void registerHostOp(const KilnOp& op);

}  // namespace kiln
