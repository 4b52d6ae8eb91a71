#include "kernels/cpu/denormals.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define KILN_HAVE_MXCSR 1
#else
#define KILN_HAVE_MXCSR 0
#endif

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kiln {
namespace {

#if KILN_HAVE_MXCSR
constexpr unsigned kFlushBits = 0x8040;  // FTZ (bit 15) and DAZ (bit 6)

// What this calling thread last gave its OpenMP pool: the denormal bits and
// the team size they reached. -1: never.
thread_local int pool_team = -1;
thread_local unsigned pool_bits = 0;

// Brings every thread of the calling thread's pool to `bits`, when the last
// run of this thread left it otherwise.
void matchPool(unsigned bits) {
#if defined(_OPENMP)
  if (omp_in_parallel()) return;  // nested: the kernels run on this thread alone
  const int team = omp_get_max_threads();
  if (team <= 1 || (team == pool_team && bits == pool_bits)) return;
#pragma omp parallel
  _mm_setcsr((_mm_getcsr() & ~kFlushBits) | bits);
  pool_team = team;
  pool_bits = bits;
#else
  (void)bits;
#endif
}
#endif

}  // namespace

DenormalsScope::DenormalsScope(bool flush) {
#if KILN_HAVE_MXCSR
  saved_ = _mm_getcsr();
  if (flush) _mm_setcsr(saved_ | kFlushBits);
  matchPool(_mm_getcsr() & kFlushBits);
#else
  (void)flush;
#endif
}

DenormalsScope::~DenormalsScope() {
#if KILN_HAVE_MXCSR
  _mm_setcsr(saved_);
#endif
}

bool DenormalsScope::flushing() {
#if KILN_HAVE_MXCSR
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
#else
  return false;
#endif
}

}  // namespace kiln
