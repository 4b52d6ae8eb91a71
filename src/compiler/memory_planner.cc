#include "compiler/memory_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "format/blob_header.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr uint64_t kMaxBytes = std::numeric_limits<uint64_t>::max();
// A tensor's own alignment is at most this (KILN_PLUGIN_MAX_ALIGNMENT's
// 4096 with room to spare): it bounds the gaps alignment leaves.
constexpr uint64_t kMaxOwnAlignment = uint64_t{1} << 20;

bool lifetimesIntersect(const TensorLifetime& a, const TensorLifetime& b) {
  return a.first_step <= b.last_step && b.first_step <= a.last_step;
}

// Rounds every size up to `alignment` and checks everything planMemory relies
// on, so that the planning itself cannot fail or overflow: the greedy never
// places a tensor above the sum of the sizes placed so far, so once that sum
// fits in 64 bits every offset and end does too.
std::vector<uint64_t> validatedAlignedSizes(std::span<const TensorLifetime> tensors, uint64_t alignment,
                                            uint64_t* total_bytes) {
  if (!std::has_single_bit(alignment)) {
    throw UsageError(fmt::format("memory plan: alignment must be a power of two, got {}", alignment));
  }
  std::vector<uint64_t> aligned_sizes(tensors.size());
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorLifetime& tensor = tensors[i];
    if (tensor.first_step > tensor.last_step) {
      throw UsageError(fmt::format("memory plan: tensor {} is produced at step {} but last read at step {}, before it",
                                   i, tensor.first_step, tensor.last_step));
    }
    if (tensor.size_bytes > kMaxBytes - (alignment - 1)) {
      throw UsageError(fmt::format("memory plan: tensor {} has {} bytes, which overflow 64 bits when rounded up to "
                                   "the alignment of {}",
                                   i, tensor.size_bytes, alignment));
    }
    if (tensor.alignment != 0 && (!std::has_single_bit(tensor.alignment) || tensor.alignment > kMaxOwnAlignment)) {
      throw UsageError(fmt::format("memory plan: tensor {} asks for an alignment of {} (a power of two up to {})", i,
                                   tensor.alignment, kMaxOwnAlignment));
    }
    const uint64_t aligned = alignUp(tensor.size_bytes, alignment);
    // Its own alignment may cost up to that many bytes of gap below it.
    if (aligned > kMaxBytes - total - tensor.alignment) {
      throw UsageError(fmt::format("memory plan: the sizes of tensors 0 to {} add up to more than 2^64 bytes", i));
    }
    aligned_sizes[i] = aligned;
    total += aligned + tensor.alignment;
  }
  *total_bytes = total;
  return aligned_sizes;
}

// The most bytes live at any one step: no valid plan can use a smaller arena.
uint64_t peakLiveBytes(std::span<const TensorLifetime> tensors, const std::vector<uint64_t>& aligned_sizes) {
  struct Event {
    uint64_t step;  // 64 bits: a departure happens at last_step + 1
    bool arrives;
    uint64_t bytes;
  };
  std::vector<Event> events;
  events.reserve(2 * tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (aligned_sizes[i] == 0) continue;
    events.push_back({tensors[i].first_step, true, aligned_sizes[i]});
    events.push_back({uint64_t{tensors[i].last_step} + 1, false, aligned_sizes[i]});
  }
  // Departures before arrivals at the same step: a tensor last read at step s
  // and one produced at s + 1 are never live together.
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return a.step != b.step ? a.step < b.step : a.arrives < b.arrives; });
  uint64_t live = 0;
  uint64_t peak = 0;
  for (const Event& event : events) {
    if (event.arrives) {
      live += event.bytes;
      peak = std::max(peak, live);
    } else {
      live -= event.bytes;
    }
  }
  return peak;
}

// A tensor already placed, with what the greedy needs to read in its inner
// loop kept together.
struct Placement {
  uint64_t offset;
  uint64_t end;
  TensorLifetime lifetime;
};

// The paper's best fit. Walking the placed tensors that conflict with
// `lifetime` in offset order while tracking the highest end seen so far, the
// space between that end and the next conflicting offset is free for this
// tensor. Takes the smallest such gap that fits (the lowest among equal
// gaps), else the highest end.
// A tensor with an alignment of its own (above the plan's) starts at the
// gap's first multiple of it, and only the rest of the gap counts.
uint64_t bestFitOffset(const std::vector<Placement>& placed_by_offset, const TensorLifetime& lifetime,
                       uint64_t size, uint64_t alignment) {
  uint64_t highest_end = 0;
  uint64_t best_gap = kMaxBytes;
  std::optional<uint64_t> best_offset;
  for (const Placement& other : placed_by_offset) {
    if (!lifetimesIntersect(other.lifetime, lifetime)) continue;
    const uint64_t start = alignUp(highest_end, alignment);
    if (other.offset > start) {
      const uint64_t gap = other.offset - start;
      if (gap >= size && gap < best_gap) {
        best_gap = gap;
        best_offset = start;
        if (gap == size) break;  // no gap can fit tighter, and a later one would be higher
      }
    }
    highest_end = std::max(highest_end, other.end);
  }
  return best_offset.value_or(alignUp(highest_end, alignment));
}

std::string humanBytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  // From 1023.95 on, "{:.1f}" would print 1024.0 of the smaller unit.
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

}  // namespace

MemoryPlan planMemory(std::span<const TensorLifetime> tensors, uint64_t alignment) {
  MemoryPlan plan;
  const std::vector<uint64_t> aligned_sizes = validatedAlignedSizes(tensors, alignment, &plan.naive_bytes);
  plan.lower_bound_bytes = peakLiveBytes(tensors, aligned_sizes);
  plan.offsets.assign(tensors.size(), 0);

  // Largest first, as the paper does; the tie-breaks only make the order (and
  // so the plan) independent of the sort algorithm.
  std::vector<size_t> order;
  order.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (aligned_sizes[i] > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (aligned_sizes[a] != aligned_sizes[b]) return aligned_sizes[a] > aligned_sizes[b];
    if (tensors[a].first_step != tensors[b].first_step) return tensors[a].first_step < tensors[b].first_step;
    return a < b;
  });

  std::vector<Placement> placed_by_offset;
  placed_by_offset.reserve(order.size());
  for (const size_t index : order) {
    const uint64_t own = std::max(alignment, tensors[index].alignment);
    const uint64_t offset = bestFitOffset(placed_by_offset, tensors[index], aligned_sizes[index], own);
    if (own > alignment) plan.arena_bytes = std::max(plan.arena_bytes, own);
    const Placement placement{offset, offset + aligned_sizes[index], tensors[index]};
    const auto position = std::upper_bound(placed_by_offset.begin(), placed_by_offset.end(), offset,
                                           [](uint64_t value, const Placement& p) { return value < p.offset; });
    placed_by_offset.insert(position, placement);
    plan.offsets[index] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, placement.end);
  }
  return plan;
}

bool planIsValid(std::span<const TensorLifetime> tensors, const MemoryPlan& plan, uint64_t alignment,
                 std::string* problem) {
  const auto fail = [problem](std::string text) {
    if (problem != nullptr) *problem = std::move(text);
    return false;
  };
  if (!std::has_single_bit(alignment)) return fail(fmt::format("alignment {} is not a power of two", alignment));
  if (plan.offsets.size() != tensors.size()) {
    return fail(fmt::format("the plan has {} offsets for {} tensors", plan.offsets.size(), tensors.size()));
  }
  std::vector<size_t> occupying;  // the tensors that have bytes
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorLifetime& tensor = tensors[i];
    const uint64_t offset = plan.offsets[i];
    if (tensor.first_step > tensor.last_step) {
      return fail(fmt::format("tensor {} starts at step {}, after its last step {}", i, tensor.first_step,
                              tensor.last_step));
    }
    const uint64_t own = std::max(alignment, tensor.alignment);
    if (!std::has_single_bit(own)) return fail(fmt::format("tensor {} has the alignment {}", i, tensor.alignment));
    if (offset % own != 0) {
      return fail(fmt::format("tensor {} is at offset {}, not a multiple of the alignment {}", i, offset, own));
    }
    if (tensor.size_bytes > plan.arena_bytes || offset > plan.arena_bytes - tensor.size_bytes) {
      return fail(fmt::format("tensor {} at offset {} with {} bytes ends past the arena's {} bytes", i, offset,
                              tensor.size_bytes, plan.arena_bytes));
    }
    if (tensor.size_bytes > 0) occupying.push_back(i);
  }

  // Sweep over steps, keeping the tensors live at the current step in a map
  // by offset. Every tensor joining the map is checked against its neighbours
  // only: the map's ranges are disjoint (or we have already failed), so a
  // range that overlaps any of them overlaps the one starting at or below its
  // offset or the one starting just above.
  std::vector<size_t> by_first_step = occupying;
  std::vector<size_t> by_last_step = occupying;
  std::stable_sort(by_first_step.begin(), by_first_step.end(),
                   [&](size_t a, size_t b) { return tensors[a].first_step < tensors[b].first_step; });
  std::stable_sort(by_last_step.begin(), by_last_step.end(),
                   [&](size_t a, size_t b) { return tensors[a].last_step < tensors[b].last_step; });
  const auto end_of = [&](size_t i) { return plan.offsets[i] + tensors[i].size_bytes; };  // <= arena_bytes
  const auto conflict = [&](size_t a, size_t b) {
    const uint64_t from = std::max(plan.offsets[a], plan.offsets[b]);
    const uint64_t to = std::min(end_of(a), end_of(b));
    const uint32_t step = std::max(tensors[a].first_step, tensors[b].first_step);
    return fail(fmt::format("tensors {} and {} are both live at step {} and share bytes [{}, {})", std::min(a, b),
                            std::max(a, b), step, from, to));
  };

  std::map<uint64_t, size_t> live_by_offset;
  size_t next_to_retire = 0;
  for (const size_t i : by_first_step) {
    const uint32_t step = tensors[i].first_step;
    while (next_to_retire < by_last_step.size() && tensors[by_last_step[next_to_retire]].last_step < step) {
      live_by_offset.erase(plan.offsets[by_last_step[next_to_retire]]);
      ++next_to_retire;
    }
    const uint64_t offset = plan.offsets[i];
    auto above = live_by_offset.lower_bound(offset);  // first live range starting at or above `offset`
    if (above != live_by_offset.end() && above->first < end_of(i)) return conflict(i, above->second);
    if (above != live_by_offset.begin()) {
      const size_t below = std::prev(above)->second;
      if (end_of(below) > offset) return conflict(i, below);
    }
    live_by_offset.emplace(offset, i);
  }
  return true;
}

std::string describePlan(const MemoryPlan& plan) {
  const double ratio = plan.lower_bound_bytes == 0
                           ? 1.0
                           : static_cast<double>(plan.arena_bytes) / static_cast<double>(plan.lower_bound_bytes);
  const double saved_percent =
      plan.naive_bytes == 0
          ? 0.0
          : 100.0 * (1.0 - static_cast<double>(plan.arena_bytes) / static_cast<double>(plan.naive_bytes));
  return fmt::format("arena {}, lower bound {} ({:.2f}x), naive {} (saves {:.0f}%)", humanBytes(plan.arena_bytes),
                     humanBytes(plan.lower_bound_bytes), ratio, humanBytes(plan.naive_bytes), saved_percent);
}

}  // namespace kiln
