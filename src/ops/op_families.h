// The op families, one file each; OpRegistry::global() registers them all.
// Adding a family: write its file, declare its function here, call it in
// op_registry.cc.
#pragma once

namespace kiln {

class OpRegistry;

void registerElementwiseOps(OpRegistry& registry);  // elementwise.cc: unary, binary (broadcast), Where, Clip, Cast
void registerShapeOps(OpRegistry& registry);        // shape_ops.cc: Reshape, Transpose, Concat, Slice, Gather, ...
void registerNnOps(OpRegistry& registry);           // nn_ops.cc: Conv, pooling, MatMul, Gemm, normalisation, Softmax
void registerReductionOps(OpRegistry& registry);    // reductions.cc: ReduceSum/Mean/Max/..., ArgMax/ArgMin
void registerIndexingOps(OpRegistry& registry);     // indexing_ops.cc: TensorScatter, EyeLike, Einsum, Det, ...
void registerControlFlowOps(OpRegistry& registry);  // control_flow.cc: If, Loop, Scan
void registerNormalizationOps(OpRegistry& registry);  // normalization_ops.cc: LpNormalization, MeanVarianceNormalization
void registerRecurrentOps(OpRegistry& registry);    // recurrent_ops.cc: RNN, GRU, LSTM
void registerLossOps(OpRegistry& registry);         // loss_ops.cc: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
void registerTransformerOps(OpRegistry& registry);  // transformer_ops.cc: Attention, RotaryEmbedding, RMSNormalization, SwiGLU
void registerQuantizationOps(OpRegistry& registry);  // quantization_ops.cc: (De)QuantizeLinear, QLinearMatMul/Conv, ...
void registerSignalOps(OpRegistry& registry);        // signal_ops.cc: DFT, STFT, window functions, MelWeightMatrix
void registerSamplingOps(OpRegistry& registry);      // sampling_ops.cc: GridSample, AffineGrid, RoiAlign, DeformConv
void registerLinearAttentionOps(OpRegistry& registry);  // linear_attention_ops.cc: LinearAttention, CausalConvWithState
void registerFlexAttentionOps(OpRegistry& registry);  // flex_attention_ops.cc: FlexAttention (ai.onnx.preview)
void registerSelectionOps(OpRegistry& registry);    // selection_ops.cc: NonZero, NonMaxSuppression, Compress, Unique
void registerMlOps(OpRegistry& registry);           // ml_ops.cc: ai.onnx.ml ArrayFeatureExtractor, Binarizer, TreeEnsemble
void registerPluginOps(OpRegistry& registry);       // plugin_ops.cc: kiln.Plugin, ops from plugin libraries

}  // namespace kiln
