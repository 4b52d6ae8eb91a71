// Metadata: what is needed to load and run one executable.
//
// A Metadata blob names the executable it belongs to and describes the target
// it was compiled for, its program flow (which programs to run at load, per
// inference, and to save state), the names of its programs, and its anchors:
// the named inputs and outputs that the runtime connects to data.
//
// An anchor whose name matches a TensorData or FeedData blob is provided by
// the package and bound automatically by the runtime; every other anchor must
// be provided by the user.
//
// Thread safety: plain value types.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/tensor_info.h"

namespace kiln {

enum class AnchorDirection : uint8_t { kInput = 0, kOutput = 1 };

// Anchor::batch_dim value meaning "this anchor has no batch dimension"
// (the reference runtime's 0xFFFFFFFF).
inline constexpr uint32_t kNoBatchDim = 0xFFFFFFFFu;

struct Anchor {
  std::string name;              // tensor name, usually from the source model
  std::string handle;            // stream handle the runtime connects to
  std::vector<uint32_t> programs;  // indices of the programs that use it
  TensorInfo info;               // shape of ONE replica and ONE repeat block
  AnchorDirection direction = AnchorDirection::kInput;
  bool is_per_replica = false;   // different data in each replica
  bool use_remote_buffers = false;
  uint32_t repeats = 1;          // remote-buffer blocks, >= 1
  uint32_t batch_dim = kNoBatchDim;  // dimension of `info.shape` that is the batch

  friend bool operator==(const Anchor&, const Anchor&) = default;
};

// The shape the data for `anchor` has in memory when the model runs with
// `replication_factor` replicas. The reference's rule:
//   - a `repeats` dimension is added in front when use_remote_buffers is set
//     and repeats > 1;
//   - a `replication_factor` dimension is added in front of that when
//     is_per_replica is set and replication_factor > 1.
TensorInfo effectiveTensorInfo(const Anchor& anchor, uint32_t replication_factor);

struct Target {
  std::string device_kind = "cpu";     // "cpu", "sim", "cuda"
  uint32_t num_devices = 1;            // devices one replica spans
  std::vector<std::string> features;   // required device features

  friend bool operator==(const Target&, const Target&) = default;
};

// Lists of program indices, run in order.
struct ProgramFlow {
  std::vector<uint32_t> load;  // once, after the executable is loaded
  std::vector<uint32_t> main;  // once per inference
  std::vector<uint32_t> save;  // to read state back (for example weights)

  friend bool operator==(const ProgramFlow&, const ProgramFlow&) = default;
};

struct Metadata {
  std::string executable;                    // name of the Executable blob
  Target target;
  uint32_t replication_factor = 1;
  bool is_inference = true;
  std::map<std::string, std::string> options;  // compile/runtime options
  ProgramFlow program_flow;
  std::map<uint32_t, std::string> programs;    // program index -> name
  std::vector<Anchor> anchors;

  // Anchors by direction, in stored order; outputs() leaves out the save
  // programs' anchors (saveAnchors()), so that it lists the model's outputs.
  std::vector<const Anchor*> inputs() const;
  std::vector<const Anchor*> outputs() const;
  // Whether an output anchor belongs to a save program: it reads back the
  // load anchor (a variable) of the same name.
  bool isSaveAnchor(const Anchor& anchor) const;
  std::vector<const Anchor*> saveAnchors() const;
  // Whether an input anchor feeds a load program (a weight) rather than the
  // main program; the main program's inputs are the others, in stored order.
  bool isLoadAnchor(const Anchor& anchor) const;
  std::vector<const Anchor*> mainInputs() const;

  // The anchor with this name and direction, or nullptr.
  const Anchor* findAnchor(const std::string& name, AnchorDirection direction) const;

  friend bool operator==(const Metadata&, const Metadata&) = default;
};

// Checks the rules every Metadata must satisfy; returns "" when valid, else
// the first problem found, phrased for an error message:
//   - executable, target.device_kind non-empty; num_devices, replication
//     factor >= 1;
//   - every program index in the program flow and in the anchors is in
//     `programs`;
//   - anchors: non-empty name and handle, valid dtype, rank <= kMaxRank,
//     dimensions >= 0 or kDynamicDim, repeats >= 1, batch_dim < rank or
//     kNoBatchDim; names unique per direction; handles unique.
std::string findMetadataProblem(const Metadata& metadata);

}  // namespace kiln
