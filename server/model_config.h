// A served model's settings: the optional config.json beside its versions
// in the model repository (docs/serving.md lists the keys).
//
//   models/
//     resnet/
//       config.json          optional
//       1/model.kiln
//       2/model.kiln
//
// Unknown keys and values of the wrong type are refused with a message
// that names them, so that a typo does not silently fall back to a default.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/device.h"

namespace kiln::server {

enum class VersionPolicy { kLatest, kAll };

struct ModelConfig {
  // Rows a request may carry on the batching dimension; 0: the compiled
  // batch's rows. Requests with more rows are refused (400).
  int64_t max_batch_size = 0;
  // The dimension requests batch on. Unset: dimension 0 when every input
  // and output has the same leading size (a model compiled with --batch),
  // else none (requests carry whole compiled tensors). -1 turns it off.
  std::optional<int64_t> batching_dim;
  // How long a partial device batch waits for rows of other requests (the
  // ModelRunner's timeout_ns: the queue delay). 0, as Triton's default: a
  // batch runs with the rows there are, and requests that arrive while it
  // runs form the next one, so batches grow with the load by themselves
  // and a lone request never waits (bench/RESULTS.md measures both).
  std::chrono::microseconds max_queue_delay{0};
  // While requests come concurrently, a partial batch also waits up to
  // this fraction of the model's recent batch run time (the ModelRunner's
  // adaptive_timeout): the clients the last batch answered send their next
  // requests meanwhile, and a batch that costs as much with 1 row as with
  // 8 runs full. A lone client never waits. 0: off.
  double adaptive_queue_delay = 0.1;
  // Rows the model's queues hold before requests are refused with 503;
  // 0: 64 compiled batches.
  int64_t max_queue_rows = 0;
  uint32_t instances = 1;   // replicas (ModelRunner replication_factor)
  std::optional<DeviceKind> device_kind;  // unset: the package's target
  int threads = 0;          // kernel threads per instance; 0: the device's
  VersionPolicy version_policy = VersionPolicy::kLatest;
};

// Model names are single folder names of [A-Za-z0-9_.-], at most 128
// characters, not starting with a dot: a name from a request can never
// reach outside the repository.
bool isValidModelName(const std::string& name);

// Parses config.json text; throws kiln::UsageError naming the file and key.
ModelConfig parseModelConfig(const std::string& json_text, const std::string& source);

}  // namespace kiln::server
