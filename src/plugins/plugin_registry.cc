#include "plugins/plugin_registry.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>

#include "core/checksum.h"
#include "kiln/error.h"
#include "kiln/plugins.h"

namespace kiln {
namespace {

// Inputs or outputs an op may have (the kernel builds them on the stack).
constexpr int32_t kMaxOperands = 64;

// Domains whose ops are ONNX's or kiln's own: a plugin may not add to them.
bool isReservedDomain(std::string_view domain) {
  return domain.empty() || domain == "ai.onnx" || domain == "ai.onnx.ml" || domain == "kiln" ||
         domain.starts_with("ai.onnx.");
}


// What one registration collects before it is committed.
struct Registration {
  const PluginLibrary* library = nullptr;
  const PluginRegistry* registry = nullptr;
  std::vector<std::unique_ptr<PluginOp>> ops;
  std::string error;  // the first refused op's reason
};

bool overlaps(const KilnOp& a, const KilnOp& b) {
  const int64_t a_end = a.until_version == 0 ? INT64_MAX : a.until_version;
  const int64_t b_end = b.until_version == 0 ? INT64_MAX : b.until_version;
  return a.since_version <= b_end && b.since_version <= a_end;
}

// Checks `op` and copies the fields kiln knows; "" when accepted.
std::string acceptOp(const KilnOp* op, PluginOp& out) {
  if (op == nullptr) return "register_op was given a null op";
  if (op->struct_size < KILN_OP_MIN_SIZE) {
    return fmt::format("its KilnOp has struct_size {}, below the {} bytes of the required fields", op->struct_size,
                       KILN_OP_MIN_SIZE);
  }
  // Every header's sizeof(KilnOp) is a multiple of its alignment; another
  // size would end inside a field, and half a pointer would be copied.
  if (op->struct_size % alignof(KilnOp) != 0) {
    return fmt::format("its KilnOp has struct_size {}, which is no header's size (a multiple of {})", op->struct_size,
                       alignof(KilnOp));
  }
  // Cap: read what both sides know; the fields past the plugin's struct keep
  // their defaults (zero), the fields past kiln's are ignored.
  std::memcpy(&out.abi, op, std::min<size_t>(op->struct_size, sizeof(KilnOp)));
  KilnOp& abi = out.abi;
  if (abi.domain == nullptr || abi.name == nullptr || abi.name[0] == '\0') return "an op without a domain or a name";
  out.domain = abi.domain;
  out.name = abi.name;
  const std::string op_name = out.domain + "." + out.name;
  if (isReservedDomain(out.domain)) {
    return fmt::format("op {}: domain '{}' is ONNX's or kiln's own; use a domain of your own", op_name, out.domain);
  }
  if (abi.since_version < 1 || (abi.until_version != 0 && abi.until_version < abi.since_version)) {
    return fmt::format("op {}: version range [{}, {}] is empty or starts below 1", op_name, abi.since_version,
                       abi.until_version);
  }
  if (abi.min_inputs < 0 || abi.min_inputs > abi.max_inputs || abi.max_inputs > kMaxOperands) {
    return fmt::format("op {}: inputs {} to {} (0 <= min <= max <= {})", op_name, abi.min_inputs, abi.max_inputs,
                       kMaxOperands);
  }
  if (abi.min_outputs < 1 || abi.min_outputs > abi.max_outputs || abi.max_outputs > kMaxOperands) {
    return fmt::format("op {}: outputs {} to {} (1 <= min <= max <= {})", op_name, abi.min_outputs,
                       abi.max_outputs, kMaxOperands);
  }
  if (abi.build == nullptr && (abi.infer == nullptr || abi.compute == nullptr)) {
    return fmt::format("op {}: infer and compute are required (or build, for a composite op)", op_name);
  }
  if (abi.num_inplace > static_cast<uint32_t>(std::min(abi.min_inputs, abi.min_outputs))) {
    return fmt::format("op {}: num_inplace {} is more than its fewest inputs ({}) or outputs ({})", op_name,
                       abi.num_inplace, abi.min_inputs, abi.min_outputs);
  }
  if (abi.gradient_op != nullptr) out.gradient_op = abi.gradient_op;
  abi.domain = out.domain.c_str();
  abi.name = out.name.c_str();
  abi.gradient_op = out.gradient_op.empty() ? nullptr : out.gradient_op.c_str();
  return "";
}

int registerOp(void* context, const KilnOp* op, char* error, size_t capacity) {
  auto& registration = *static_cast<Registration*>(context);
  auto plugin_op = std::make_unique<PluginOp>();
  plugin_op->library = registration.library;
  std::string problem = acceptOp(op, *plugin_op);
  if (problem.empty()) {
    const auto clashes = [&](const PluginOp& other) {
      return other.domain == plugin_op->domain && other.name == plugin_op->name && overlaps(other.abi, plugin_op->abi);
    };
    for (const auto& other : registration.ops) {
      if (clashes(*other)) problem = fmt::format("op {} is registered twice for the same versions", plugin_op->describe());
    }
    const PluginOp* existing = registration.registry->findOp(plugin_op->domain, plugin_op->name, plugin_op->abi.since_version);
    if (problem.empty() && existing != nullptr) {
      problem = fmt::format("op {}.{} is already registered by {}", plugin_op->domain, plugin_op->name,
                            existing->describe());
    }
  }
  if (!problem.empty()) {
    if (registration.error.empty()) registration.error = problem;
    if (error != nullptr && capacity > 0) std::snprintf(error, capacity, "%s", problem.c_str());
    return 1;
  }
  registration.ops.push_back(std::move(plugin_op));
  return 0;
}

}  // namespace

std::string callbackMessage(char* buffer, size_t capacity) {
  buffer[capacity - 1] = '\0';
  return buffer[0] == '\0' ? std::string("(no message)") : std::string(buffer);
}

std::string refusalOf(const KilnOp* op) {
  PluginOp scratch;
  return acceptOp(op, scratch);
}

std::string PluginOp::describe() const {
  return fmt::format("{}.{} (plugin {})", domain, name, library == nullptr ? "?" : library->name);
}

PluginRegistry& PluginRegistry::global() {
  static PluginRegistry registry;
  return registry;
}

uint64_t hashFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read plugin library '{}'", path.string()));
  Checksum64 hash;
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    hash.update(std::as_bytes(std::span(buffer.data(), got)));
  }
  return hash.digest();
}

const PluginLibrary& PluginRegistry::load(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  if (ec || !std::filesystem::is_regular_file(absolute)) {
    throw UsageError(fmt::format("plugin library '{}' not found (or not a regular file)", path.string()));
  }
  // One load at a time; lookups (findOp, from registerOp too) go on meanwhile.
  std::lock_guard serial(load_mutex_);
  const std::string name = absolute.filename().string();
  const uint64_t hash = hashFile(absolute);
  for (const PluginLibrary* library : libraries()) {
    if (library->path == absolute && library->hash == hash) return *library;
    if (library->name == name) {
      if (library->hash == hash) return *library;  // the same bytes from another folder
      throw UsageError(fmt::format("plugin library '{}': a different library of the same name is already loaded "
                                   "from '{}'",
                                   absolute.string(), library->path.string()));
    }
  }
  void* handle = dlopen(absolute.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    throw UsageError(fmt::format("plugin library '{}' cannot be loaded: {}", absolute.string(),
                                 reason == nullptr ? "unknown reason" : reason));
  }
  auto close_on_error = [&](const std::string& message) -> UsageError {
    dlclose(handle);
    return UsageError(fmt::format("plugin library '{}': {}", absolute.string(), message));
  };
  const auto* level = static_cast<const uint32_t*>(dlsym(handle, KILN_PLUGIN_LEVEL_SYMBOL));
  if (level == nullptr) throw close_on_error("not a kiln plugin: it exports no " KILN_PLUGIN_LEVEL_SYMBOL);
  const auto entry = reinterpret_cast<KilnPluginRegisterFunction>(dlsym(handle, KILN_PLUGIN_REGISTER_SYMBOL));
  if (entry == nullptr) throw close_on_error("not a kiln plugin: it exports no " KILN_PLUGIN_REGISTER_SYMBOL "()");
  if (*level > KILN_PLUGIN_API_LEVEL || *level == 0) {
    throw close_on_error(fmt::format("it needs plugin API level {}; this kiln has level {} (a newer kiln is needed)",
                                     *level, KILN_PLUGIN_API_LEVEL));
  }
  auto library = std::make_unique<PluginLibrary>();
  library->name = name;
  library->path = absolute;
  library->api_level = *level;
  library->hash = hash;
  library->handle = handle;

  Registration registration{.library = library.get(), .registry = this, .ops = {}, .error = {}};
  const KilnPluginHost host{.struct_size = sizeof(KilnPluginHost), .api_level = KILN_PLUGIN_API_LEVEL,
                            .context = &registration, .register_op = &registerOp};
  char error[512] = {0};
  const int status = entry(&host, error, sizeof error);
  if (status != 0 || !registration.error.empty()) {
    const std::string reason = !registration.error.empty() ? registration.error : callbackMessage(error, sizeof error);
    throw close_on_error("registration failed: " + reason);
  }
  if (registration.ops.empty()) throw close_on_error("registration succeeded but registered no op");
  std::unique_lock lock(mutex_);
  for (auto& op : registration.ops) ops_.push_back(std::move(op));
  libraries_.push_back(std::move(library));
  return *libraries_.back();
}

const PluginOp* PluginRegistry::findOp(std::string_view domain, std::string_view name, int64_t version) const {
  std::shared_lock lock(mutex_);
  for (const auto& op : ops_) {
    if (op->domain != domain || op->name != name) continue;
    if (version < op->abi.since_version) continue;
    if (op->abi.until_version != 0 && version > op->abi.until_version) continue;
    return op.get();
  }
  return nullptr;
}

const PluginLibrary* PluginRegistry::findLibrary(std::string_view name) const {
  std::shared_lock lock(mutex_);
  for (const auto& library : libraries_) {
    if (library->name == name) return library.get();
  }
  return nullptr;
}

std::vector<const PluginLibrary*> PluginRegistry::libraries() const {
  std::shared_lock lock(mutex_);
  std::vector<const PluginLibrary*> result;
  for (const auto& library : libraries_) result.push_back(library.get());
  return result;
}

namespace {

LoadedPlugin describeLibrary(const PluginLibrary& library, const std::vector<std::string>& ops) {
  return LoadedPlugin{library.name, library.path, library.api_level, fmt::format("{:016x}", library.hash), ops};
}

}  // namespace

std::vector<std::string> PluginRegistry::opsOf(const PluginLibrary& library) const {
  std::shared_lock lock(mutex_);
  std::vector<std::string> names;
  for (const auto& op : ops_) {
    if (op->library == &library) names.push_back(op->domain + "." + op->name);
  }
  return names;
}

const PluginOp& PluginRegistry::registerHostOp(const KilnOp& op) {
  std::lock_guard serial(load_mutex_);
  const PluginLibrary* host = findLibrary(kHostLibrary);
  if (host == nullptr) {
    auto library = std::make_unique<PluginLibrary>();
    library->name = kHostLibrary;
    library->api_level = KILN_PLUGIN_API_LEVEL;
    std::unique_lock lock(mutex_);
    libraries_.push_back(std::move(library));
    host = libraries_.back().get();
  }
  Registration registration{.library = host, .registry = this, .ops = {}, .error = {}};
  char error[512] = {0};
  if (registerOp(&registration, &op, error, sizeof error) != 0) {
    throw UsageError("host function refused: " + registration.error);
  }
  std::unique_lock lock(mutex_);
  ops_.push_back(std::move(registration.ops.front()));
  return *ops_.back();
}

void registerHostOp(const KilnOp& op) { PluginRegistry::global().registerHostOp(op); }

LoadedPlugin loadPlugin(const std::filesystem::path& path) {
  const PluginLibrary& library = PluginRegistry::global().load(path);
  return describeLibrary(library, PluginRegistry::global().opsOf(library));
}

std::vector<LoadedPlugin> loadedPlugins() {
  std::vector<LoadedPlugin> result;
  for (const PluginLibrary* library : PluginRegistry::global().libraries()) {
    result.push_back(describeLibrary(*library, PluginRegistry::global().opsOf(*library)));
  }
  return result;
}

}  // namespace kiln
