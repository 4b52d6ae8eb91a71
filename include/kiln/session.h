// Session: an executable loaded onto a device, connected to data.
//
// The session uploads the executable, binds the anchors the package
// provides (TensorData for weights and constant inputs, FeedData for inputs
// fed one item per run, cycling) and connects every other anchor, the
// user's, to the queues of a QueueManager (createQueueManager()).
// runMainPrograms() then runs the main program over the queued data until
// stop(): it gathers each device batch from the queues, moves the data to
// the device, runs, and writes the results into the queued output memory,
// keeping several batches in flight on a device with its own memory so that
// transfers overlap compute.
//
// Anchors the package provides can be excluded from automatic binding with
// predicates (SessionOptions::exclude_from_binding): the user then provides
// them, with bindTensor() for load anchors (weights) or through the queues
// for main-program inputs.
//
// A partial batch (fewer rows queued than the device runs at once) waits at
// most `timeout` for more rows, then is flushed: the flush callback may
// supply the missing rows' inputs and outputs; rows it does not supply read
// zeros and their outputs are dropped.
//
// Thread safety: runMainPrograms runs on one thread at a time; stop() may
// be called from any thread; everything else from the thread that owns the
// session, while the main programs are not running.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/device.h"
#include "kiln/executable.h"
#include "kiln/queue_manager.h"

namespace kiln {

class PackageReader;

// Caller memory for one tensor. `dtype` is optional: when set, the model
// runner checks it against the anchor's.
struct ConstTensorMemoryView {
  const void* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kUndefined;
};
struct TensorMemoryView {
  void* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kUndefined;
};
using InputMemoryView = std::unordered_map<std::string, ConstTensorMemoryView>;
using OutputMemoryView = std::unordered_map<std::string, TensorMemoryView>;

// Called once when a partial batch times out, with the anchor the device was
// waiting for. It may point `inputs` / `outputs` at memory for the missing
// rows of any anchor (each view holds exactly the missing rows, laid out as
// the anchor with that many rows in its batch dimension); anchors it leaves
// out are flushed. The views must stay valid until the batch completes.
using FlushCallback = std::function<void(const std::string& tensor_id, const InputMemoryView*& inputs,
                                         const OutputMemoryView*& outputs)>;

struct SessionOptions {
  // An anchor the package provides is left to the user when any predicate
  // returns true for it.
  std::vector<std::function<bool(const Anchor&)>> exclude_from_binding;
  ExecutableOptions executable;
  // How long a partial batch waits for more rows before it is flushed.
  std::chrono::nanoseconds timeout{std::chrono::milliseconds(5)};
  // kiln's addition: while requests come concurrently (the last batch
  // carried several, rows were already waiting when this one began, or
  // another batch is still on the device), a partial batch waits up to this
  // fraction of the recent batch run time (at most a minute) when that is
  // longer than `timeout`. 0: off. See main_loop.h.
  double adaptive_timeout = 0;
  FlushCallback flush_callback;
  // Called once, on a device thread, when the main programs fail, before
  // any entry is answered with the error (the model runner holds new
  // requests back from then until it has handled the error).
  std::function<void(const std::exception_ptr&)> on_failure;
  // Batches in flight at once on a device with its own memory (each has
  // its own staging buffers on the device); 1 on cpu. 1 to
  // kMaxPipelineDepth (deeper, the device threads' callbacks could wait on
  // each other's full job queues).
  uint32_t pipeline_depth = 3;
  static constexpr uint32_t kMaxPipelineDepth = 64;
};

class Session {
 public:
  // Loads `model` (empty: the package's only model) onto `device`.
  Session(std::shared_ptr<const PackageReader> package, std::shared_ptr<Device> device, SessionOptions options = {},
          const std::string& model = "");
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Executable& executable();
  Device& device();

  // The main-program anchors the user provides (through the queues): the
  // model's inputs and outputs that the package does not provide, plus the
  // excluded ones.
  const std::vector<Anchor>& userInputs() const;
  const std::vector<Anchor>& userOutputs() const;
  // Load anchors excluded from binding: bindTensor() must provide each.
  std::vector<std::string> unboundLoadAnchors() const;

  // Gives the bytes of an excluded load anchor (kept by reference: they
  // must stay valid while the session lives). Throws UsageError for an
  // unknown anchor or a wrong size.
  void bindTensor(const std::string& anchor, std::span<const std::byte> bytes);

  // Runs the load programs (uploads the weights). Again after a device reset.
  void runLoadPrograms();

  // Creates the queues of the user anchors, each holding `capacity`
  // entries, batched on `batch_dim`: kAnchorBatchDim (the default) batches
  // each anchor on its own Anchor::batch_dim, kNoBatchDim makes each entry
  // a whole tensor, and a dimension batches every anchor on it. The session
  // keeps the QueueManager; a second call replaces it.
  QueueManager& createQueueManager(size_t capacity, uint32_t batch_dim = kAnchorBatchDim);
  QueueManager* queueManager();

  // Runs the main program over the queued data until stop() or
  // QueueManager::disconnectAll(). When the device fails, finishes the
  // batches in flight (their entries get the error), leaves later entries
  // queued, and throws the device's error. Throws UsageError when the load
  // programs have not run or there is no QueueManager.
  void runMainPrograms();
  // Makes the running runMainPrograms return (or the next one, when none
  // runs yet) once the batches in flight are done.
  void stop();

  // Finishes every entry still queued with `error` (after a failure, so
  // that no request waits forever). Not while runMainPrograms runs.
  void failQueuedEntries(const std::exception_ptr& error);

  // Copies the variables (Executable::saveAnchors) from the device into
  // `sink`; nothing for a package without variables.
  void runSavePrograms(const SaveSink& sink);

  // Device batches run so far, and how many of them were flushed partial.
  uint64_t batchesRun() const;
  uint64_t batchesFlushed() const;
  // [k]: device batches that carried k rows from the queues (k = 0 .. the
  // compiled batch's rows; the rest was flush padding). Empty before
  // createQueueManager().
  std::vector<uint64_t> batchRowsHistogram() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
