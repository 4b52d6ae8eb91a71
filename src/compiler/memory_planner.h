// Static memory planner: places every intermediate tensor of a program at a
// byte offset inside one arena, so that running the program allocates
// nothing (DESIGN.md, "No allocation in the steady state").
//
// Input: one TensorLifetime per tensor, the steps during which it must hold
// its bytes. Two tensors conflict when both have bytes and their step
// intervals intersect; conflicting tensors get disjoint byte ranges, others
// may share memory.
//
// Algorithm: "Greedy by Size for Offset Calculation" (Pisarchyk & Lee,
// arXiv:2001.03288, section 5.2). Tensors are placed largest first; each goes
// into the smallest gap, between the already placed tensors it conflicts with
// (in offset order), that fits it ("best fit"), or else just above the
// highest of them. O(n^2) time in the number of tensors, O(n) memory. It is
// a heuristic: the arena may exceed the lower bound (the most bytes live at
// any one step), which is why every plan reports both.
//
// Invariants of a MemoryPlan returned by planMemory:
//   - offsets.size() == tensors.size(); every offset is a multiple of the
//     alignment and of the tensor's own; a zero-size tensor has offset 0 and
//     takes no space;
//   - arena_bytes is at least every tensor's own alignment, so that an arena
//     allocated by a kiln device (aligned to its size's largest power of
//     two, up to 4096 bytes: runtime/device_internal.h) is aligned for all;
//   - conflicting tensors occupy disjoint [offset, offset + aligned size);
//   - lower_bound_bytes <= arena_bytes <= naive_bytes;
//   - the result depends only on the input (equal inputs give equal plans).
// planIsValid checks what makes a plan safe to run (one aligned offset per
// tensor, inside the arena, conflicting tensors disjoint), independently of
// how the plan was made.
//
// Thread safety: these are pure functions of their arguments; call them from
// any number of threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kiln {

// A tensor holds its bytes from the step that produces it through the last
// step that reads it, both inclusive. `alignment` raises the plan's
// alignment for this tensor alone (a plugin's allocator hook): 0 or a power
// of two.
struct TensorLifetime {
  uint64_t size_bytes = 0;
  uint32_t first_step = 0;
  uint32_t last_step = 0;
  uint64_t alignment = 0;
};

struct MemoryPlan {
  std::vector<uint64_t> offsets;   // offsets[i]: where tensor i starts in the arena
  uint64_t arena_bytes = 0;        // max over tensors of offset + aligned size
  uint64_t lower_bound_bytes = 0;  // max over steps of the aligned bytes live at that step
  uint64_t naive_bytes = 0;        // sum of all aligned sizes: the arena without any reuse
};

// Plans `tensors` into one arena. Sizes are rounded up to `alignment`, and
// every offset is a multiple of it, so a tensor placed in an arena whose base
// is `alignment`-aligned is itself aligned.
//
// Throws UsageError, naming the tensor, if a lifetime ends before it starts,
// if `alignment` or a tensor's own is not a power of two, or if a rounded size or the total of
// all sizes does not fit in 64 bits.
MemoryPlan planMemory(std::span<const TensorLifetime> tensors, uint64_t alignment = 64);

// Checks that `plan` is safe to run with: one offset per tensor, every offset
// a multiple of `alignment` and of the tensor's own, every tensor's bytes inside arena_bytes, and no
// two conflicting tensors sharing a byte. Works on any plan (it does not
// assume planMemory made it) in O(n log n). On failure returns false and, if
// `problem` is not null, says which tensors and bytes are wrong. The reported
// lower-bound and naive figures are statistics and are not checked.
bool planIsValid(std::span<const TensorLifetime> tensors, const MemoryPlan& plan, uint64_t alignment,
                 std::string* problem);

// One line for `kiln compile --plan-report`, e.g.
//   arena 12.0 MiB, lower bound 11.5 MiB (1.04x), naive 40.2 MiB (saves 70%)
// The ratio is arena / lower bound; "saves" is the share of naive_bytes that
// reuse saved.
std::string describePlan(const MemoryPlan& plan);

}  // namespace kiln
