// ArenaSizer: how big the arena of a program with dynamic shapes should be,
// the bookkeeping behind "standard resizing" (shared/reference/
// static-runtime.txt).
//
// With dynamic shapes, how many bytes a run needs depends on its inputs.
// Sizing the arena exactly for every run would put the heap on the steady-
// state path, so the arena only grows: before each run its owner reports the
// bytes that run needs, and the capacity becomes the largest need seen so
// far. Once the largest inputs have been seen, no run reallocates (warm up
// with them to get there at once). shrink() lowers the capacity on demand,
// for example after a burst of unusually large inputs, accepting that a later
// large run grows it again.
//
// This class only keeps the numbers; the owner allocates. Unlike the
// reference, which records sizes at the end of a run and falls back to
// dynamic allocations during it, kiln knows a run's needs before it starts
// (shape inference), so the arena is grown before the run.
//
// Invariant: capacityBytes() is at least every need reported since the last
// shrink(), and is the largest of them and of the capacity that shrink() left.
//
// Thread safety: none. An ArenaSizer belongs to one arena and is used by
// whoever holds that arena, one call at a time.
//
// Layering note: this is run-time code. It has no dependency on the planner
// and is header-only so that the runtime can take it over (DESIGN.md: the
// runtime must not depend on the compiler).
#pragma once

#include <cstdint>

namespace kiln {

class ArenaSizer {
 public:
  // `initial_bytes`: the capacity before any run, typically the arena that
  // the compiler planned for the model's declared shapes.
  explicit ArenaSizer(uint64_t initial_bytes = 0) : capacity_bytes_(initial_bytes) {}

  // Records that the next run needs `needed_bytes`. Returns true when that is
  // more than the capacity: the capacity has become `needed_bytes` and the
  // owner must reallocate the arena before the run.
  bool request(uint64_t needed_bytes) {
    if (needed_bytes <= capacity_bytes_) return false;
    capacity_bytes_ = needed_bytes;
    ++growth_count_;
    return true;
  }

  // Lowers the capacity to `target_bytes` (never raises it). Returns true
  // when it went down: the owner may then reallocate a smaller arena.
  bool shrink(uint64_t target_bytes = 0) {
    if (target_bytes >= capacity_bytes_) return false;
    capacity_bytes_ = target_bytes;
    return true;
  }

  // The size the arena should have now.
  uint64_t capacityBytes() const { return capacity_bytes_; }

  // How many requests have grown the capacity: after warm-up this should stop
  // changing, which is how a runtime can check that it no longer allocates.
  uint64_t growthCount() const { return growth_count_; }

 private:
  uint64_t capacity_bytes_;
  uint64_t growth_count_ = 0;
};

}  // namespace kiln
