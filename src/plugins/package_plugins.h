// The plugins a package needs, recorded in its Metadata options and loaded
// again when the package is loaded.
//
// Each library is one option: "plugin.<file name>" = "level=<api level>;
// hash=<XXH3-64 of its bytes, 16 hex digits>". At load, a library not
// loaded yet is looked for, by file name, in the folders of KILN_PLUGIN_PATH
// (':'-separated, in order), then in the package's own folder; a library
// whose bytes differ from the recorded hash is refused unless hash checks
// are off (the reference runtime's check_package_hash), since a different
// build may compute something else. With KILN_PLUGIN_AUTOLOAD=0 nothing is
// loaded: a package may use only libraries the application loaded itself
// (loading a library runs its code: docs/security.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln {

struct PluginLibrary;

inline constexpr const char* kPluginOptionPrefix = "plugin.";

struct PackagePlugin {
  std::string name;  // file name
  uint32_t api_level = 0;
  uint64_t hash = 0;
};

void recordPlugins(std::map<std::string, std::string>& options, const std::vector<const PluginLibrary*>& libraries);

// The plugins `options` names; FormatError on a malformed entry.
std::vector<PackagePlugin> packagePlugins(const std::map<std::string, std::string>& options);

// Loads (once per process) every plugin `options` names. UsageError: a
// library not found (naming the folders searched), or loaded or found with
// other bytes than recorded (when check_hash), or refused by the loader.
void loadPackagePlugins(const std::map<std::string, std::string>& options, const std::filesystem::path& package,
                        bool check_hash = true);

}  // namespace kiln
