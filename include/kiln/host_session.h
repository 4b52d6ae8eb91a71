// HostSession: a model driven from the host one call at a time, with
// variables: the reference's popxl.Session (shared/reference/session.txt) on
// kiln's devices. The Python kiln.Session wraps it (docs/session.md).
//
// Devices: attach() takes `replication_factor` devices of the kind asked
// (through a DeviceManager), loads the model on each (one Executable per
// replica) and sends them the host's copy of the variables
// (weightsFromHost). detach() fetches the variables back when they may have
// changed (weightsToHost) and gives the devices back; their memory is lost.
//
// Variables are the package's save anchors (kiln compile --variables). The
// session keeps a host copy of each, made from the package's data, and
// follows the reference's lazy rules:
//   - run() may change the variables on the device: the host copy is stale
//     from then on;
//   - readTensor(s) of a variable while attached and stale: one
//     weightsToHost first (one for all the names); detached, or fresh: none,
//     the host copy as it is. A constant (a weight that is not a variable)
//     never causes a transfer;
//   - writeVariable(s) updates the host copy and, while attached, the
//     devices' (one weightsFromHost for all the names); the host copy stays
//     fresh;
//   - attach(): weightsFromHost; detach(): weightsToHost when stale.
// weightsToHostCount() and weightsFromHostCount() count the transfers.
//
// run(): each main-program input holds num_host_transfers x
// replication_factor slices of its anchor, in that order (the reference's
// [num_host_transfers, replication_factor, *shape]); each output too. One
// call runs the main program num_host_transfers times on every replica,
// replica r reading and writing slice (n, r) in round n. An inference
// package's replicas run one after another; a training package's only when
// it was compiled for replicas (TrainingOptions::gradient_all_reduce =
// kReplicaAllReduce), and then all at once, one thread each (started by
// attach), their gradients averaged so that their variables stay in step.
//
// Thread safety: none; one thread drives a session at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/executable.h"
#include "kiln/session.h"

namespace kiln {

class PackageReader;

struct HostSessionOptions {
  // A device kind ("cpu", "sim", "cuda") or one device ("sim:1", with one
  // replica); empty: the package's target.
  std::string device;
  uint32_t replication_factor = 1;
  uint32_t num_host_transfers = 1;
  DeviceManager* device_manager = nullptr;  // null: one built from the environment
  DeviceWaitConfig device_wait;
  std::string model;  // which model of the package; empty: its only one
  ExecutableOptions executable;
};

class HostSession {
 public:
  HostSession(std::shared_ptr<const PackageReader> package, HostSessionOptions options = {});
  ~HostSession();
  HostSession(const HostSession&) = delete;
  HostSession& operator=(const HostSession&) = delete;

  // The main program's anchors (one replica, one host transfer), the
  // variables and the constants (weights that are not variables).
  const std::vector<Anchor>& inputs() const;
  const std::vector<Anchor>& outputs() const;
  const std::vector<Anchor>& variables() const;
  const std::vector<Anchor>& constants() const;
  const HostSessionOptions& options() const;

  // Attaches (and sends the variables); false when already attached.
  bool attach();
  // Detaches (fetching the variables first when stale); false when not
  // attached.
  bool detach();
  bool isAttached() const;

  // Runs num_host_transfers rounds on every replica. Every input and output
  // must be given, each with num_host_transfers x replication_factor times
  // its anchor's bytes (and its dtype, when the view names one). Throws
  // UsageError naming the anchor, or when detached.
  void run(const InputMemoryView& inputs, const OutputMemoryView& outputs);

  // The variables' bytes from the devices into the host copy, and back.
  // Both need the session attached.
  void weightsToHost();
  void weightsFromHost();

  // A variable's or a constant's bytes, by the lazy rules above; valid until
  // the next call that changes the session.
  std::span<const std::byte> readTensor(const std::string& name);
  std::vector<std::span<const std::byte>> readTensors(const std::vector<std::string>& names);
  // Replaces a variable's bytes (exactly its size), by the lazy rules.
  void writeVariable(const std::string& name, std::span<const std::byte> bytes);
  void writeVariables(const std::vector<std::pair<std::string, std::span<const std::byte>>>& values);

  uint64_t weightsToHostCount() const;
  uint64_t weightsFromHostCount() const;
  // Main-program runs so far, over every replica.
  uint64_t mainRuns() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
