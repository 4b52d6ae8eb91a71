// The KServe v2 protocol's JSON documents other than inference (server and
// model metadata, model configuration, statistics, repository index), as
// the HTTP binding answers them. The gRPC binding fills the same fields
// into its messages (grpc_frontend.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/model_repository.h"

namespace kiln::server {

// The protocol extensions kiln implements, as server metadata lists them.
const std::vector<std::string>& serverExtensions();

nlohmann::json serverMetadataJson();
nlohmann::json modelMetadataJson(const ServedModel& model, const std::vector<std::string>& versions);
nlohmann::json modelConfigJson(const ServedModel& model);
nlohmann::json modelStatisticsJson(const std::vector<std::shared_ptr<ServedModel>>& models);
nlohmann::json repositoryIndexJson(const std::vector<ModelIndexEntry>& index);

// The loaded versions of `name`, oldest first.
std::vector<std::string> loadedVersions(const ModelRepository& repository, const std::string& name);

}  // namespace kiln::server
