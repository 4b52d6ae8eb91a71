// The CPU kernel families, one file each; KernelRegistry::cpu() registers
// them all. Adding a family: write its file, declare its function here and
// call it in kernel_registry.cc.
#pragma once

namespace kiln {

class KernelRegistry;

void registerElementwiseKernels(KernelRegistry& registry);  // elementwise.cc: unary, binary with broadcasting
void registerFusedElementwiseKernels(KernelRegistry& registry);  // fused_elementwise.cc: kiln.FusedElementwise
void registerMatMulKernels(KernelRegistry& registry);       // matmul.cc: MatMul, Gemm, kiln.FusedMatMul, kiln.FusedGemm
void registerCopyKernels(KernelRegistry& registry);         // copy.cc: kiln.Copy (byte copy for views)
void registerDataMovementKernels(KernelRegistry& registry);  // data_movement.cc: Transpose, Concat, Split, Slice, Gather, Expand, Tile, Where, Pad, Resize
void registerReductionKernels(KernelRegistry& registry);     // reduction.cc: Reduce*, ArgMax, ArgMin
void registerConvKernels(KernelRegistry& registry);         // conv.cc: Conv, ConvTranspose (oneDNN)
void registerPoolKernels(KernelRegistry& registry);         // pool.cc: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool
void registerNormalizationKernels(KernelRegistry& registry);  // normalization.cc: BatchNormalization, LayerNormalization, Softmax, LogSoftmax
void registerIndexingKernels(KernelRegistry& registry);  // indexing.cc: gathers, scatters, TopK, Trilu, OneHot, Range, CumSum, Einsum, ...
void registerFeatureNormalizationKernels(KernelRegistry& registry);  // feature_normalization.cc: InstanceNormalization, GroupNormalization, MeanVarianceNormalization, LpNormalization, Hardmax, LRN
void registerRecurrentKernels(KernelRegistry& registry);    // recurrent.cc: RNN, GRU, LSTM
void registerLossKernels(KernelRegistry& registry);         // losses.cc: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, Dropout
void registerTransformerKernels(KernelRegistry& registry);  // transformer.cc: Attention, RotaryEmbedding, RMSNormalization, SwiGLU
void registerCastKernels(KernelRegistry& registry);          // cast.cc: Cast, CastLike (every dtype)
void registerQuantizationKernels(KernelRegistry& registry);  // quantization.cc: (De)QuantizeLinear, QLinearMatMul/Conv, ...
void registerQuantizedConvKernels(KernelRegistry& registry);  // quantized_conv.cc: kiln.NhwcQLinearConv (oneDNN int8)
void registerQuantizedAddKernels(KernelRegistry& registry);   // quantized_add.cc: kiln.QLinearAdd, kiln.QLinearMul
void registerByteTableKernels(KernelRegistry& registry);      // byte_table.cc: kiln.Lookup8
void registerDynamicInt8Kernels(KernelRegistry& registry);  // dynamic_int8_matmul.cc: kiln.DynamicInt8MatMul
void registerSignalKernels(KernelRegistry& registry);        // signal.cc: DFT, STFT, window functions, MelWeightMatrix
void registerSamplingKernels(KernelRegistry& registry);      // sampling.cc: GridSample, AffineGrid, RoiAlign, DeformConv
void registerLinearAttentionKernels(KernelRegistry& registry);  // linear_attention.cc: LinearAttention, CausalConvWithState
void registerFlexAttentionKernels(KernelRegistry& registry);  // flex_attention.cc: ai.onnx.preview.FlexAttention
void registerSelectionKernels(KernelRegistry& registry);   // selection.cc: NonZero, NonMaxSuppression, Compress, Unique
void registerMlKernels(KernelRegistry& registry);          // ml.cc: ai.onnx.ml ArrayFeatureExtractor, Binarizer, TreeEnsemble
void registerPluginKernels(KernelRegistry& registry);      // plugin_kernel.cc: kiln.Plugin, ops from plugin libraries

}  // namespace kiln
