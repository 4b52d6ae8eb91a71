#include "plugins/package_plugins.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "kiln/error.h"
#include "plugins/plugin_registry.h"

namespace kiln {
namespace {

std::vector<std::filesystem::path> searchPath(const std::filesystem::path& package) {
  std::vector<std::filesystem::path> folders;
  if (const char* env = std::getenv("KILN_PLUGIN_PATH"); env != nullptr) {
    std::stringstream list(env);
    std::string folder;
    while (std::getline(list, folder, ':')) {
      if (!folder.empty()) folders.emplace_back(folder);
    }
  }
  folders.push_back(package.has_parent_path() ? package.parent_path() : std::filesystem::path("."));
  return folders;
}

std::string hex(uint64_t hash) { return fmt::format("{:016x}", hash); }

// KILN_PLUGIN_AUTOLOAD=0: packages may use only libraries the application
// loaded itself (a server of untrusted packages: docs/security.md).
bool autoloadAllowed() {
  const char* value = std::getenv("KILN_PLUGIN_AUTOLOAD");
  return value == nullptr || std::string_view(value) != "0";
}

}  // namespace

void recordPlugins(std::map<std::string, std::string>& options, const std::vector<const PluginLibrary*>& libraries) {
  for (const PluginLibrary* library : libraries) {
    options[kPluginOptionPrefix + library->name] = fmt::format("level={};hash={}", library->api_level, hex(library->hash));
  }
}

std::vector<PackagePlugin> packagePlugins(const std::map<std::string, std::string>& options) {
  std::vector<PackagePlugin> plugins;
  for (const auto& [key, value] : options) {
    if (!key.starts_with(kPluginOptionPrefix)) continue;
    PackagePlugin plugin;
    plugin.name = key.substr(std::string_view(kPluginOptionPrefix).size());
    unsigned level = 0;
    char hash[17] = {0};
    if (plugin.name.empty() || plugin.name.find('/') != std::string::npos ||
        std::sscanf(value.c_str(), "level=%u;hash=%16[0-9a-f]", &level, hash) != 2 || std::strlen(hash) != 16) {
      throw FormatError("metadata", 0, fmt::format("option '{}' = '{}' is not a plugin record", key, value));
    }
    plugin.api_level = level;
    plugin.hash = std::strtoull(hash, nullptr, 16);
    plugins.push_back(std::move(plugin));
  }
  return plugins;
}

void loadPackagePlugins(const std::map<std::string, std::string>& options, const std::filesystem::path& package,
                        bool check_hash) {
  for (const PackagePlugin& plugin : packagePlugins(options)) {
    if (plugin.name == kHostLibrary) continue;  // registered by the application, checked per step
    const PluginLibrary* library = PluginRegistry::global().findLibrary(plugin.name);
    if (library == nullptr && !autoloadAllowed()) {
      throw UsageError(fmt::format("{} needs plugin library '{}', which is not loaded, and KILN_PLUGIN_AUTOLOAD=0 "
                                   "forbids loading the libraries packages name (load it with kiln::loadPlugin or "
                                   "kiln.load_plugin first)",
                                   package.string(), plugin.name));
    }
    if (library == nullptr) {
      const auto folders = searchPath(package);
      for (const auto& folder : folders) {
        const std::filesystem::path candidate = folder / plugin.name;
        std::error_code ec;
        if (!std::filesystem::is_regular_file(candidate, ec)) continue;
        if (check_hash && hashFile(candidate) != plugin.hash) {
          throw UsageError(fmt::format("{} needs plugin library '{}' with hash {}, but '{}' has hash {} (another build "
                                       "of it); rebuild the package with this library, or turn the hash check off",
                                       package.string(), plugin.name, hex(plugin.hash), candidate.string(),
                                       hex(hashFile(candidate))));
        }
        library = &PluginRegistry::global().load(candidate);
        break;
      }
      if (library == nullptr) {
        std::string searched;
        for (const auto& folder : folders) searched += (searched.empty() ? "" : ", ") + folder.string();
        throw UsageError(fmt::format("{} needs plugin library '{}', which is not loaded and not found in: {} (set "
                                     "KILN_PLUGIN_PATH to its folder)",
                                     package.string(), plugin.name, searched));
      }
    }
    if (check_hash && library->hash != plugin.hash) {
      throw UsageError(fmt::format("{} needs plugin library '{}' with hash {}, but the one loaded from '{}' has hash {} "
                                   "(another build of it)",
                                   package.string(), plugin.name, hex(plugin.hash), library->path.string(),
                                   hex(library->hash)));
    }
  }
}

}  // namespace kiln
