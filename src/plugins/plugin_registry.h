// The plugins kiln has loaded: shared libraries that add operators through
// the C ABI of include/kiln/plugin.h, and the ops they registered.
//
// Loading a library (load):
//   dlopen -> kiln_plugin_api_level (refused when above kiln's level) ->
//   kiln_plugin_register, whose ops are checked one by one (names, counts,
//   version ranges, required callbacks) and kept only when the whole
//   registration succeeds. A library is loaded once per process and never
//   unloaded: the ops' function pointers live as long as the process.
// The library's identity is its file name ("libmy_ops.so") and the XXH3-64
// hash of its bytes, which packages record (plugin_packages.h).
//
// Thread safety: every member may be called from any thread; lookups share
// a lock, loads take it alone. PluginOp and PluginLibrary objects are never
// moved or freed once registered.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/plugin.h"

namespace kiln {

// The "library" of host functions, registered by the application itself
// (kiln::registerHostOp, kiln.register_host_op) rather than loaded.
inline constexpr const char* kHostLibrary = "<host>";

struct PluginLibrary {
  std::string name;  // the file name, which packages refer to
  std::filesystem::path path;
  uint32_t api_level = 0;  // what the library needs (kiln_plugin_api_level)
  uint64_t hash = 0;       // XXH3-64 of the file's bytes
  void* handle = nullptr;  // from dlopen
};

// One registered op: the ABI struct as kiln reads it (fields the plugin's
// header did not have set to their defaults), with kiln's copies of its
// strings.
struct PluginOp {
  const PluginLibrary* library = nullptr;
  std::string domain;
  std::string name;
  std::string gradient_op;  // "" when it declares none
  KilnOp abi{};  // abi.domain, abi.name and abi.gradient_op point into the strings above

  // "com.example.Rotate (plugin libmy_ops.so)", for messages.
  std::string describe() const;
};

class PluginRegistry {
 public:
  static PluginRegistry& global();

  // Loads the library at `path`, or returns the one already loaded from
  // there. Throws UsageError naming the file and the problem: not found, not
  // a shared library, not a kiln plugin (a symbol missing), an API level
  // above kiln's, a registration error or a refused op, a library of the
  // same file name already loaded from elsewhere with other bytes.
  const PluginLibrary& load(const std::filesystem::path& path);

  // The op serving `domain`.`name` at opset `version` of its domain, or
  // nullptr.
  const PluginOp* findOp(std::string_view domain, std::string_view name, int64_t version) const;

  // The loaded library of that file name, or nullptr.
  const PluginLibrary* findLibrary(std::string_view name) const;

  std::vector<const PluginLibrary*> libraries() const;

  // Registers `op` as a host function of this process (no library): its
  // library is kHostLibrary. The same checks as a library's ops; UsageError
  // naming the reason when refused.
  const PluginOp& registerHostOp(const KilnOp& op);

  // "domain.name" of each op `library` registered.
  std::vector<std::string> opsOf(const PluginLibrary& library) const;

 private:
  std::mutex load_mutex_;  // serializes load()
  mutable std::shared_mutex mutex_;  // guards the two lists
  std::vector<std::unique_ptr<PluginLibrary>> libraries_;
  std::vector<std::unique_ptr<PluginOp>> ops_;
};

// Why registration would refuse `op` ("" when it would accept it): the
// checks register_op makes of one op, without registering it. Reads no
// byte of *op past op->struct_size, and no string unless the struct holds
// it. (For the fuzz target and tests.)
std::string refusalOf(const KilnOp* op);

// The message a plugin callback wrote into `buffer` (the ABI's error
// buffer), read safely: NUL-terminated here whatever the plugin did;
// "(no message)" when it wrote none.
std::string callbackMessage(char* buffer, size_t capacity);

// XXH3-64 of a file's bytes; throws UsageError when it cannot be read.
uint64_t hashFile(const std::filesystem::path& path);

}  // namespace kiln
