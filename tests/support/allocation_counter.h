// Counts heap allocations made by any thread while counting is on, to check
// that kernels do not allocate when they run. The NVIDIA driver's own
// threads, which allocate on their own schedule once a process has touched
// a GPU, are left out (named "cuda..."; see allocation_counter.cc).
//
// Always counted: every replaceable global operator new (this program and
// every library it loads, since the program's definitions replace them all).
// Also counted on glibc when no sanitizer owns malloc: every call to malloc,
// calloc, realloc, posix_memalign, aligned_alloc and memalign, which catches
// C code and libraries that allocate without operator new (oneDNN's own
// buffers). An operator new counts once in each.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::testing {

struct AllocationCount {
  uint64_t news = 0;
  uint64_t mallocs = 0;
};

// True where malloc and friends are counted too.
bool countsMallocs();

void startCountingAllocations();
AllocationCount stopCountingAllocations();

// From now on, every operator new of `bytes` or more throws std::bad_alloc
// (0: none does), in every thread: to test what a failed allocation leaves
// behind. Tests set it back to 0 when done.
void failAllocationsOfAtLeast(std::size_t bytes);

}  // namespace kiln::testing
