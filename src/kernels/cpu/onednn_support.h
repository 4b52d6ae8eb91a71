// oneDNN plumbing shared by the CPU kernels that run oneDNN primitives
// (matmul.cc, conv.cc, pool.cc): the CPU engine, f32 memory descriptors, a
// one-time reorder of constant weights, and execution slots.
//
// Execution slots. A kernel's run may execute concurrently on one state. The
// Debian oneDNN (2.6) is built with DNNL_ENABLE_CONCURRENT_EXEC, under which
// one primitive may run concurrently only with scratchpad_mode::user and its
// own scratchpad per execution; a dnnl memory object also holds its data
// pointer, so concurrent executions need their own. Creating memory objects or
// streams per call allocates (one `new` and two `malloc`s each, measured), so
// a state owns kExecutionSlots slots, each with a stream, memory objects and a
// scratchpad, all made at prepare.
//
// Thread-safety contract. ExecutionSlots::create and the slots' memory
// objects are set up at prepare, on one thread. During run, claim() hands out
// a slot that no other run holds (yielding while every slot is busy); the run
// points the slot's memory objects at its tensors (setHandle), executes, and
// execute() releases the slot. The busy flags are the only mutable state
// concurrent runs share; a slot's stream, memory objects and scratchpad are
// only touched by the run that holds its flag, although the state is const.
//
// dnnl_primitive_execute itself still allocates a few small objects on every
// call (oneDNN 2.6 copies the arguments into a std::unordered_map). That is
// inside oneDNN and cannot be avoided through its API; tests/kernels measures
// it.
#pragma once

#include <dnnl.h>

#include <atomic>
#include <cstddef>
#include <dnnl.hpp>
#include <memory>
#include <string_view>

#include "core/fused_activation.h"
#include "core/param_map.h"

namespace kiln::onednn {

using Dims = dnnl::memory::dims;

// Executions of one step that may run at the same time without waiting. Each
// slot costs one scratchpad (from a few KiB to a few MiB for large products).
constexpr size_t kExecutionSlots = 4;

// The CPU engine every kernel's primitives and memory objects use.
const dnnl::engine& cpuEngine();

// Dense row-major strides of `dims` (a size-0 dimension counts as 1).
Dims denseStrides(const Dims& dims);

// An f32 descriptor with explicit strides.
inline dnnl::memory::desc f32Desc(const Dims& dims, const Dims& strides) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

// A dense row-major f32 descriptor.
inline dnnl::memory::desc plainDesc(const Dims& dims) { return f32Desc(dims, denseStrides(dims)); }

// Constant weights at `data` (described by `from`, only read) reordered once
// into new memory described by `to`.
dnnl::memory reorderConstant(const dnnl::memory::desc& from, const std::byte* data, const dnnl::memory::desc& to);

// What one execution needs for itself; see the top of the file. A kernel sets
// up the memory objects it uses at prepare (with DNNL_MEMORY_NONE where the
// data arrive per call) and leaves the others empty.
struct ExecutionSlot {
  std::atomic<bool> busy{false};
  dnnl::stream stream;
  dnnl::memory src;
  dnnl::memory src_plain;  // a source that arrives per call in f32, before its conversion into `src` (bf16 products)
  dnnl::memory weights;
  dnnl::memory weights_plain;  // weights that arrive per call, before their reorder into `weights`
  dnnl::memory bias;
  dnnl::memory dst;
  dnnl::memory binary;  // the second operand of a binary post-op (a residual Add)
  dnnl::memory zero_point;  // an integer primitive's source zero point, per call
  dnnl::memory scratchpad;
};

// Appends the eltwise post-op that computes `activation` (with its
// parameters, see core/fused_activation.h); nothing for kNone.
void appendActivation(dnnl::post_ops& ops, FusedActivation activation, float alpha, float beta);

// The post-ops of a fused Conv, from its attributes `post_ops` (kinds,
// comma-separated), `post_op_alpha` and `post_op_beta` (see
// src/passes/conv_fusion.h). An "Add" becomes a binary add of a tensor
// described by `dst`; `binary_index` receives its position among the oneDNN
// post-ops (-1 without one). Throws UsageError naming `op` on an unknown kind.
dnnl::post_ops fusedPostOps(std::string_view op, const ParamMap& params, const dnnl::memory::desc& dst,
                            int& binary_index);

// The kExecutionSlots slots of one state.
class ExecutionSlots {
 public:
  // Makes the slots, each with its own stream and, when `scratchpad` has a
  // size, its own scratchpad.
  void create(const dnnl::engine& engine, const dnnl::memory::desc& scratchpad);
  void reset() { slots_.reset(); }

  bool hasScratchpad() const { return has_scratchpad_; }
  ExecutionSlot& operator[](size_t i) const { return slots_[i]; }

  // A free slot, claimed for the caller until execute releases it.
  ExecutionSlot& claim() const;

 private:
  std::unique_ptr<ExecutionSlot[]> slots_;
  bool has_scratchpad_ = false;
};

// Writes "kiln: <kernel> kernel: <what> failed with oneDNN status <status>"
// to stderr and aborts. run cannot report errors, and the primitive was built
// for exactly these shapes at prepare: a failure there is a bug, not bad input.
[[noreturn]] void dnnlFailed(const char* kernel, const char* what, dnnl_status_t status);

// Points `memory` at `data`; aborts through dnnlFailed on failure.
void setHandle(const char* kernel, const dnnl::memory& memory, void* data);

// Appends the slot's scratchpad to `args` (which must have room for it) when
// there is one, executes `primitive` on the slot's stream, waits, and
// releases the slot; aborts through dnnlFailed on failure.
void execute(const char* kernel, const dnnl::primitive& primitive, const ExecutionSlots& slots, ExecutionSlot& slot,
             dnnl_exec_arg_t* args, int count);

// Runs `reorder` from the slot's weights_plain into its weights on the
// slot's stream and waits, keeping the slot claimed (the primitive that
// reads the weights runs next); aborts through dnnlFailed on failure.
void reorderWeights(const char* kernel, const dnnl::primitive& reorder, ExecutionSlot& slot);

// The same from the slot's src_plain into its src (a bf16 product's f32
// source converted per call).
void reorderSource(const char* kernel, const dnnl::primitive& reorder, ExecutionSlot& slot);

}  // namespace kiln::onednn
