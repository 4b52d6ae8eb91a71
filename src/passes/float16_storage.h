// Opt-in 16-bit float storage for the cuda target: f16 (`kiln compile
// --fp16`, CompileOptions::fp16, Python fp16=True) or bf16 (`--bf16`,
// CompileOptions::bf16, bf16=True). What follows says f16; bf16 is the
// same with these differences: bf16 has f32's range, so nothing is clamped
// and elementwise work on values computed in f32 converts too; and it keeps
// 8 bits of mantissa (about 4e-3 relative) where f16 keeps 11.
//
// On GPUs the time of most steps is memory traffic, and products and
// convolutions run on f16 tensor cores several times faster than in f32.
// This pass stores in f16 every f32 value that is made and read by steps
// whose cuda kernels take f16: their inputs and outputs become f16 tensors,
// while each kernel still computes in f32 (products and convolutions sum in
// f32, elementwise programs, Softmax and LayerNormalization work in f32
// registers), rounding only as it stores, as onnxruntime's CUDA provider
// runs a model converted to f16.
//
// The steps it converts (kFloat16Ops, with every float input f32 and every
// output f32): products (MatMul, Gemm, kiln.FusedMatMul, kiln.FusedGemm),
// convolutions (Conv, ConvTranspose, kiln.FusedConv), elementwise work
// (kiln.FusedElementwise and the single ops the cuda elementwise kernel
// runs), Softmax, LogSoftmax, LayerNormalization, the pools, Resize (its
// data; roi and scales stay f32), Where, and the data movement that only
// moves elements (Transpose, Slice, Expand, Concat, Split, Gather's data,
// Reshape and the other views). Elementwise work,
// pools and data movement that read a value some other step computed in f32
// (a reduction's sum, a host step's output) stay f32 as well, since its range is
// unknown: magika's sum of squares (1.3e5) would be infinite in f16.
// Everything else stays f32: where such a step reads an f16 value, a Cast to f32 is put before it,
// and a converted step reading an f32 value gets a Cast to f16. f32
// initializers that converted steps read get an f16 copy (magnitudes beyond
// f16's largest finite value, 65504, are clamped to it). The model's inputs
// and outputs keep their types: callers still exchange f32.
//
// Products whose K or N is not a multiple of 8 stay f32: f16 tensor cores
// need rows of 16-byte multiples, and the f16 fallback kernels are slower
// than f32 ones.
//
// Numerics: each converted tensor carries 11 bits of mantissa (about 5e-4
// relative) and f16's range; a model whose activations exceed 65504 gets
// infinities. Hence opt-in (docs/cuda.md gives the measured errors).
// Runs on the main graph after the fusions (the Casts it inserts are steps
// of their own); subgraphs are left alone.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Returns how many steps now compute on 16-bit tensors. `storage` is
// DType::kF16 or DType::kBF16.
size_t storeInFloat16(Graph& graph, DType storage = DType::kF16);

}  // namespace kiln
