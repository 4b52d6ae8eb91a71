// Splitting one kernel call across threads.
//
// The threads are OpenMP's: oneDNN (Debian's build) runs its primitives on
// the OpenMP pool of the calling thread, so our kernels use the same pool,
// the same number of threads (OMP_NUM_THREADS) and never oversubscribe the
// cores against it. Without OpenMP (a build that did not find it) everything
// runs on the calling thread.
//
// Small work stays on the calling thread: waking the pool costs a few
// microseconds. From 32K elements on splitting pays: on two idle cores,
// MiniLM's 74 Adds (most of 128 x 384 elements) went from 1.05 to 0.72 ms
// per run with this bound instead of 64K. (On cores busy with other
// processes every split waits for a descheduled thread; no bound helps.) A
// call that is already inside a parallel region also stays there (OpenMP
// would run a nested region on one thread anyway, and allocate a team for it
// each time).
//
// No allocation in the steady state: every parallel region asks for the
// pool's default team size, which libgomp keeps and reuses from one region to
// the next (tests/kernels/parallel_test.cc checks it). The body must not
// throw.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kiln {

inline constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// Calls body(begin, end) on contiguous ranges that cover [0, count) once, one
// range per thread, when the call touches at least kParallelMinElements
// elements (count items of `item_elements` each); otherwise body(0, count).
template <typename Body>
void parallelForItems(int64_t count, int64_t item_elements, const Body& body) {
#if defined(_OPENMP)
  if (count > 1 && count * item_elements >= kParallelMinElements && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads();
      const int64_t thread = omp_get_thread_num();
      const int64_t begin = count * thread / threads;
      const int64_t end = count * (thread + 1) / threads;
      if (begin < end) body(begin, end);
    }
    return;
  }
#endif
  body(int64_t{0}, count);
}

// The same over n elements, in ranges whose bounds are multiples of 16
// elements (64 bytes of f32 or more): threads do not share cache lines of
// the output, and vector loops keep whole vectors. `element_cost` weighs an
// element against kParallelMinElements: a call that does k elementwise ops'
// work per element (a fused chain of k ops) passes k.
template <typename Body>
void parallelForElements(int64_t n, const Body& body, int64_t element_cost = 1) {
  constexpr int64_t kGrain = 16;
  parallelForItems((n + kGrain - 1) / kGrain, kGrain * element_cost, [&](int64_t begin, int64_t end) {
    body(begin * kGrain, std::min(end * kGrain, n));
  });
}

}  // namespace kiln
