// Float16 models computed in float32, as onnxruntime runs them on CPUs.
//
// CPUs without native half-precision arithmetic (most x86 ones) gain nothing
// from f16 compute: every kernel would convert to f32 and back around its
// math, rounding to f16 after every operator. Instead this pass rewrites the
// graph once: f16 weights become f32 (exact), every f16 intermediate becomes
// f32, each f16 model input is cast to f32 where it enters and each f16
// model output is cast back where it leaves, so that the fast f32 kernels run
// everything and callers still exchange f16. An explicit Cast to f16 in the
// model keeps its rounding (it is followed by a Cast back to f32).
//
// Numerics: results are at least as accurate as per-operator f16 rounding,
// and close to onnxruntime's, which inserts the same casts; they differ from
// a strict f16 evaluation by f16 rounding (about 1e-3 relative). kiln
// compile --keep-float16 (CompileOptions::float16_in_float32 = false) keeps
// the f16 kernels.
//
// Attributes that name f16 as a type (a `dtype` of 10, ConstantOfShape's and
// Constant's f16 values) become f32; subgraphs (If, Loop, Scan) are
// converted with their parent.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Returns the number of values turned from f16 to f32 (0: nothing to do).
size_t computeFloat16InFloat32(Graph& graph);

}  // namespace kiln
