#include "server/model_repository.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln::server {
namespace {

// Version folders: positive integers without leading zeros' ambiguity.
std::optional<int64_t> versionNumber(const std::string& folder) {
  if (folder.empty() || folder.size() > 18 || folder[0] == '0') return std::nullopt;
  if (!std::all_of(folder.begin(), folder.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(folder);
}

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read {}", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

ModelRepository::ModelRepository(std::filesystem::path root) : root_(std::move(root)) {
  if (!std::filesystem::is_directory(root_)) {
    throw UsageError(fmt::format("the model repository {} is not a folder", root_.string()));
  }
  reaper_ = std::thread([this] { reap(); });
}

ModelRepository::~ModelRepository() {
  std::map<std::string, Entry> entries;
  {
    std::lock_guard lock(mutex_);
    entries.swap(entries_);
  }
  for (auto& [name, entry] : entries) {
    for (auto& [number, model] : entry.versions) retire(std::move(model));
  }
  {
    std::lock_guard lock(retire_mutex_);
    stopping_ = true;
  }
  retire_wake_.notify_all();
  reaper_.join();
}

std::vector<std::string> ModelRepository::modelNames() const {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& item : std::filesystem::directory_iterator(root_, error)) {
    const std::string name = item.path().filename().string();
    if (item.is_directory() && isValidModelName(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

size_t ModelRepository::loadAll() {
  size_t failed = 0;
  for (const std::string& name : modelNames()) {
    try {
      load(name);
    } catch (const ServerError& e) {
      std::fprintf(stderr, "kiln serve: model '%s' not loaded: %s\n", name.c_str(), e.what());
      ++failed;
    }
  }
  return failed;
}

void ModelRepository::load(const std::string& name) {
  if (!isValidModelName(name)) {
    throw ServerError(StatusCode::kInvalidArgument,
                      fmt::format("'{}' is not a model name: names are one folder of [A-Za-z0-9_.-] not "
                                  "starting with '.'",
                                  name));
  }
  const std::filesystem::path folder = root_ / name;
  if (!std::filesystem::is_directory(folder)) {
    throw ServerError(StatusCode::kNotFound, fmt::format("the repository has no model '{}'", name));
  }
  std::lock_guard load_lock(load_mutex_);
  {
    std::lock_guard lock(mutex_);
    Entry& entry = entries_[name];
    if (entry.versions.empty()) entry.state = "LOADING";
  }
  std::map<int64_t, std::shared_ptr<ServedModel>> versions;
  try {
    ModelConfig config;
    if (std::filesystem::exists(folder / "config.json")) {
      config = parseModelConfig(readFile(folder / "config.json"), (folder / "config.json").string());
    }
    std::vector<int64_t> numbers;
    for (const auto& item : std::filesystem::directory_iterator(folder)) {
      const auto number = versionNumber(item.path().filename().string());
      if (number && item.is_directory() && std::filesystem::exists(item.path() / "model.kiln")) {
        numbers.push_back(*number);
      }
    }
    if (numbers.empty()) {
      throw UsageError(fmt::format("{} has no version folder (1/, 2/, ...) holding a model.kiln", folder.string()));
    }
    std::sort(numbers.begin(), numbers.end());
    if (config.version_policy == VersionPolicy::kLatest) numbers.erase(numbers.begin(), numbers.end() - 1);
    for (int64_t number : numbers) {
      const std::string version = std::to_string(number);
      versions[number] =
          std::make_shared<ServedModel>(name, version, folder / version / "model.kiln", config);
    }
  } catch (const std::exception& e) {
    const std::string reason = e.what();
    {
      std::lock_guard lock(mutex_);
      Entry& entry = entries_[name];
      // A model that served before keeps serving its old versions.
      if (entry.versions.empty()) {
        entry.state = "UNAVAILABLE";
        entry.reason = reason;
      }
    }
    throw ServerError(StatusCode::kInvalidArgument, fmt::format("model '{}' cannot be loaded: {}", name, reason));
  }
  std::map<int64_t, std::shared_ptr<ServedModel>> replaced;
  {
    std::lock_guard lock(mutex_);
    Entry& entry = entries_[name];
    replaced.swap(entry.versions);
    entry.versions = std::move(versions);
    entry.state = "READY";
    entry.reason.clear();
  }
  for (auto& [number, model] : replaced) retire(std::move(model));
}

void ModelRepository::unload(const std::string& name) {
  std::lock_guard load_lock(load_mutex_);
  std::map<int64_t, std::shared_ptr<ServedModel>> removed;
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end() || it->second.versions.empty()) {
      throw ServerError(StatusCode::kNotFound, fmt::format("model '{}' is not loaded", name));
    }
    removed.swap(it->second.versions);
    it->second.state = "UNAVAILABLE";
    it->second.reason = "unloaded";
  }
  for (auto& [number, model] : removed) retire(std::move(model));
}

std::shared_ptr<ServedModel> ModelRepository::find(const std::string& name, const std::string& version) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.versions.empty()) {
    throw ServerError(StatusCode::kNotFound, fmt::format("model '{}' is not loaded", name));
  }
  const auto& versions = it->second.versions;
  if (version.empty()) return versions.rbegin()->second;
  const auto number = versionNumber(version);
  auto found = number ? versions.find(*number) : versions.end();
  if (found == versions.end()) {
    throw ServerError(StatusCode::kNotFound, fmt::format("model '{}' has no loaded version '{}'", name, version));
  }
  return found->second;
}

std::vector<std::shared_ptr<ServedModel>> ModelRepository::loadedModels() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<ServedModel>> models;
  for (const auto& [name, entry] : entries_) {
    for (const auto& [number, model] : entry.versions) models.push_back(model);
  }
  return models;
}

std::vector<ModelIndexEntry> ModelRepository::index(bool ready_only) const {
  std::vector<std::string> names = modelNames();
  std::lock_guard lock(mutex_);
  for (const auto& [name, entry] : entries_) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  std::vector<ModelIndexEntry> index;
  for (const std::string& name : names) {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      if (!ready_only) index.push_back({name, "", "UNAVAILABLE", "not loaded"});
      continue;
    }
    const Entry& entry = it->second;
    if (entry.versions.empty()) {
      if (!ready_only) index.push_back({name, "", entry.state, entry.reason});
      continue;
    }
    for (const auto& [number, model] : entry.versions) {
      const bool ready = model->isReady();
      if (ready_only && !ready) continue;
      index.push_back({name, model->version(), ready ? "READY" : "UNAVAILABLE",
                       ready ? "" : "no device is serving it (see the server's log)"});
    }
  }
  return index;
}

bool ModelRepository::drainAll(std::chrono::nanoseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  bool all = true;
  for (const auto& model : loadedModels()) {
    const auto left = std::max(std::chrono::nanoseconds(0), deadline - std::chrono::steady_clock::now());
    all = model->drain(left) && all;
  }
  return all;
}

void ModelRepository::retire(std::shared_ptr<ServedModel> model) {
  {
    std::lock_guard lock(retire_mutex_);
    retiring_.push_back(std::move(model));
  }
  retire_wake_.notify_all();
}

void ModelRepository::reap() {
  std::unique_lock lock(retire_mutex_);
  for (;;) {
    retire_wake_.wait_for(lock, std::chrono::milliseconds(20));
    std::vector<std::shared_ptr<ServedModel>> batch;
    batch.swap(retiring_);
    const bool stopping = stopping_;
    lock.unlock();
    for (auto& model : batch) {
      // Every holder of the model is a request in flight on it or a call
      // that found it just before the swap and is about to submit (which
      // must still be served, so the model is not drained). Each lets go
      // when its request is answered, the last possibly on a runner thread,
      // which must not destroy its own runner: wait until only this
      // reference is left, then free it here.
      while (model.use_count() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      model.reset();
    }
    lock.lock();
    if (stopping && retiring_.empty()) return;
  }
}

}  // namespace kiln::server
