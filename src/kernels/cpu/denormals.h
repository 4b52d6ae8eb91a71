// Flushing denormal (subnormal) floats to zero while a program runs (and
// while the compiler folds constants).
//
// Why: on Intel cores every arithmetic instruction that reads or makes a
// denormal takes a microcode assist of about a hundred cycles. A model whose
// activations underflow (Gelu's and Sigmoid's far tails, products of many
// small factors) then runs several times slower with the same arithmetic:
// PP-OCRv6's text detector took 248 ms per run instead of 67 on a Sapphire
// Rapids core, nearly all of it in two 1x1 convolutions reading Gelu outputs
// below 1.2e-38 (onnxruntime, which keeps denormals by default, took 262 ms).
// TensorFlow flushes by default for the same reason.
//
// What it changes: every float below 1.2e-38 in magnitude is zero, as a
// result and when read. Continuous operations move by less than 1.2e-38;
// discontinuous ones see the zero (Ceil of 1e-40 is 0, not 1; Sign 0; x / 1e-40
// is inf; 1e-40 > 0 is false). Constant folding (evaluate_once.cc) folds in
// the same mode, so a folded node and a run node agree (graph_run_fuzz found
// a Ceil that did not).
//
// How: the SSE/AVX control register (MXCSR) is per thread. FTZ makes
// denormal results zero, DAZ reads denormal inputs as zero. DenormalsScope
// sets both on the calling thread for one run and restores the caller's
// register after it, and makes the OpenMP pool of that thread (where oneDNN's
// and kiln's kernels split their work) use the same mode. The pool threads
// keep it between runs: setting them costs a parallel region, so it is done
// only when the mode or the team size changed since the last run of this
// calling thread. Other threads and the caller's own code are left alone.
//
// With `flush` false the run uses the caller's mode, whatever it is (IEEE
// by default), and the pool is brought to that mode.
//
// On CPUs without MXCSR (not x86) this does nothing.
#pragma once

namespace kiln {

class DenormalsScope {
 public:
  explicit DenormalsScope(bool flush);
  ~DenormalsScope();
  DenormalsScope(const DenormalsScope&) = delete;
  DenormalsScope& operator=(const DenormalsScope&) = delete;

  // Whether the calling thread flushes denormals now (for tests).
  static bool flushing();

 private:
  unsigned saved_ = 0;
};

}  // namespace kiln
