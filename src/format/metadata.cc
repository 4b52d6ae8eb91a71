#include "kiln/metadata.h"

#include <algorithm>

#include <fmt/format.h>

#include <climits>
#include <set>
#include <utility>

namespace kiln {

TensorInfo effectiveTensorInfo(const Anchor& anchor, uint32_t replication_factor) {
  TensorInfo info = anchor.info;
  // Insert the repeats dimension first so that the replication dimension,
  // inserted after it at the front, precedes it.
  if (anchor.use_remote_buffers && anchor.repeats > 1) {
    info.shape.insert(info.shape.begin(), static_cast<int64_t>(anchor.repeats));
  }
  if (anchor.is_per_replica && replication_factor > 1) {
    info.shape.insert(info.shape.begin(), static_cast<int64_t>(replication_factor));
  }
  return info;
}

std::vector<const Anchor*> Metadata::inputs() const {
  std::vector<const Anchor*> result;
  for (const Anchor& anchor : anchors) {
    if (anchor.direction == AnchorDirection::kInput) result.push_back(&anchor);
  }
  return result;
}

namespace {

bool inAny(const Anchor& anchor, const std::vector<uint32_t>& flow) {
  for (uint32_t program : anchor.programs) {
    if (std::find(flow.begin(), flow.end(), program) != flow.end()) return true;
  }
  return false;
}

}  // namespace

std::vector<const Anchor*> Metadata::outputs() const {
  std::vector<const Anchor*> result;
  for (const Anchor& anchor : anchors) {
    if (anchor.direction == AnchorDirection::kOutput && !isSaveAnchor(anchor)) result.push_back(&anchor);
  }
  return result;
}

bool Metadata::isSaveAnchor(const Anchor& anchor) const {
  return anchor.direction == AnchorDirection::kOutput && inAny(anchor, program_flow.save);
}

std::vector<const Anchor*> Metadata::saveAnchors() const {
  std::vector<const Anchor*> result;
  for (const Anchor& anchor : anchors) {
    if (isSaveAnchor(anchor)) result.push_back(&anchor);
  }
  return result;
}

bool Metadata::isLoadAnchor(const Anchor& anchor) const {
  return anchor.direction == AnchorDirection::kInput && inAny(anchor, program_flow.load);
}

std::vector<const Anchor*> Metadata::mainInputs() const {
  std::vector<const Anchor*> result;
  for (const Anchor& anchor : anchors) {
    if (anchor.direction == AnchorDirection::kInput && !isLoadAnchor(anchor)) result.push_back(&anchor);
  }
  return result;
}

const Anchor* Metadata::findAnchor(const std::string& name, AnchorDirection direction) const {
  for (const Anchor& anchor : anchors) {
    if (anchor.name == name && anchor.direction == direction) return &anchor;
  }
  return nullptr;
}

namespace {

std::string findProgramProblem(const Metadata& m, const std::vector<uint32_t>& indices, std::string_view where) {
  for (uint32_t index : indices) {
    if (!m.programs.contains(index)) {
      return fmt::format("{} refers to program {}, which is not in the programs map", where, index);
    }
  }
  return "";
}

// True when the bytes of the known dimensions fit in 63 bits, so that every
// size computed from this shape later is exact.
bool sizeFits(const TensorInfo& info) {
  std::optional<int64_t> bytes = static_cast<int64_t>(dtypeSize(info.dtype));
  for (int64_t dim : info.shape) {
    if (dim != kDynamicDim) bytes = multiplySizes(*bytes, dim);
    if (!bytes) return false;
  }
  return true;
}

std::string findAnchorProblem(const Metadata& m, const Anchor& a) {
  const std::string label = fmt::format("anchor '{}'", a.name);
  if (a.name.empty()) return "an anchor has an empty name";
  if (a.handle.empty()) return label + " has an empty handle";
  if (!isValidDType(static_cast<uint8_t>(a.info.dtype))) return label + " has an undefined dtype";
  if (a.info.shape.size() > kMaxRank) return fmt::format("{} has rank {} (limit {})", label, a.info.shape.size(), kMaxRank);
  for (int64_t dim : a.info.shape) {
    if (dim < 0 && dim != kDynamicDim) return fmt::format("{} has invalid dimension {}", label, dim);
  }
  if (a.repeats == 0) return label + " has repeats 0 (must be >= 1)";
  if (!sizeFits(effectiveTensorInfo(a, m.replication_factor))) {
    return fmt::format("{} has a size that overflows 63 bits: {}", label, a.info.shapeString());
  }
  if (a.batch_dim != kNoBatchDim && a.batch_dim >= a.info.shape.size()) {
    return fmt::format("{} has batch dimension {} but rank {}", label, a.batch_dim, a.info.shape.size());
  }
  return findProgramProblem(m, a.programs, label);
}

}  // namespace

std::string findMetadataProblem(const Metadata& m) {
  if (m.executable.empty()) return "metadata names no executable";
  if (m.target.device_kind.empty()) return "target device kind is empty";
  if (m.target.num_devices == 0) return "target number of devices is 0 (must be >= 1)";
  if (m.replication_factor == 0) return "replication factor is 0 (must be >= 1)";
  for (const auto& [list, where] : {std::pair{&m.program_flow.load, "program flow 'load'"},
                                    std::pair{&m.program_flow.main, "program flow 'main'"},
                                    std::pair{&m.program_flow.save, "program flow 'save'"}}) {
    if (std::string problem = findProgramProblem(m, *list, where); !problem.empty()) return problem;
  }
  std::set<std::pair<std::string, AnchorDirection>> names;
  std::set<std::string> handles;
  for (const Anchor& anchor : m.anchors) {
    if (std::string problem = findAnchorProblem(m, anchor); !problem.empty()) return problem;
    if (!names.emplace(anchor.name, anchor.direction).second) {
      return fmt::format("two {} anchors are named '{}'",
                         anchor.direction == AnchorDirection::kInput ? "input" : "output", anchor.name);
    }
    if (!handles.insert(anchor.handle).second) {
      return fmt::format("two anchors use the handle '{}'", anchor.handle);
    }
  }
  return "";
}

}  // namespace kiln
