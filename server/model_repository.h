// ModelRepository: the folder of models `kiln serve` serves, and the models
// loaded from it.
//
//   DIR/<model>/config.json            optional (server/model_config.h)
//   DIR/<model>/<version>/model.kiln   version: a positive integer
//
// Model names are single folder names of [A-Za-z0-9_.-] not starting with
// a dot: a name from a request can never reach outside DIR.
//
// Loading a model (again) builds the new versions beside the old ones and
// swaps them in at once, so traffic never sees the model missing; the
// replaced versions serve every request that reached them (even one that
// found them just before the swap), then go (retire()). Unloading takes the
// model out of the index at once, with the same care for what reached it.
//
// Thread safety: every method may be called from any number of threads;
// loads and unloads run one at a time.
#pragma once

#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/served_model.h"

namespace kiln::server {

struct ModelIndexEntry {
  std::string name;
  std::string version;  // empty for a model that has no loaded version
  std::string state;    // READY, UNAVAILABLE, LOADING
  std::string reason;   // why it is not READY
};

class ModelRepository {
 public:
  explicit ModelRepository(std::filesystem::path root);
  ~ModelRepository();  // drains and frees every model
  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  const std::filesystem::path& root() const { return root_; }

  // The model folders of the repository (valid names only), sorted.
  std::vector<std::string> modelNames() const;
  // Loads every model; one that fails is recorded as UNAVAILABLE with its
  // reason (and written to stderr) and the others load. Returns how many failed.
  size_t loadAll();
  // Loads or reloads one model; throws ServerError (kNotFound: no such
  // folder; kInvalidArgument: it cannot be loaded, with the reason).
  void load(const std::string& name);
  // Throws ServerError(kNotFound) when the model is not loaded.
  void unload(const std::string& name);

  // The version to run: `version` or, when empty, the newest loaded.
  // Throws ServerError(kNotFound) when there is none.
  std::shared_ptr<ServedModel> find(const std::string& name, const std::string& version) const;
  std::vector<std::shared_ptr<ServedModel>> loadedModels() const;
  std::vector<ModelIndexEntry> index(bool ready_only) const;

  // Stops every model taking requests and waits up to `bound` for the ones
  // taken; true when all were answered.
  bool drainAll(std::chrono::nanoseconds bound);

 private:
  struct Entry {
    std::map<int64_t, std::shared_ptr<ServedModel>> versions;  // by version number
    std::string state = "UNAVAILABLE";
    std::string reason;
  };
  // Frees `model` once no request holds it, off the caller's thread (a
  // runner thread must never destroy its own runner).
  void retire(std::shared_ptr<ServedModel> model);
  void reap();

  std::filesystem::path root_;
  mutable std::mutex mutex_;       // guards entries_
  std::map<std::string, Entry> entries_;
  std::mutex load_mutex_;          // one load or unload at a time

  std::mutex retire_mutex_;
  std::condition_variable retire_wake_;
  std::vector<std::shared_ptr<ServedModel>> retiring_;
  bool stopping_ = false;
  std::thread reaper_;
};

}  // namespace kiln::server
