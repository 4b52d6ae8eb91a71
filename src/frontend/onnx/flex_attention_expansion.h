// FlexAttention's modifier subgraphs, inlined on import.
//
// ai.onnx.preview.FlexAttention may carry two subgraph attributes that ONNX
// defines by inlining (its function body): score_mod, applied to the scaled
// scores Q K^T before the softmax, and prob_mod, applied to the
// probabilities after it. Both map one [B, Hq, L, S] tensor to one of the
// same shape, with any operators. kiln inlines them the same way, so that the
// compiler sees ordinary nodes:
//
//   scores = kiln.FlexAttentionScores<scale>(Q, K)
//   scores = <score_mod's nodes>(scores)                    if score_mod
//   without prob_mod:  Y = kiln.FlexAttentionOutput<softmax=1>(scores, V)
//   with prob_mod:     probs = Softmax<axis=-1>(scores)
//                      probs = <prob_mod's nodes>(probs)
//                      Y = kiln.FlexAttentionOutput<softmax=0>(probs, V)
//
// The inlined values and initializers get fresh names prefixed with the
// node's name; values the subgraph reads from outside keep theirs. Y keeps
// its name. A FlexAttention without modifiers stays one node (its own
// kernel). Subgraphs nested in a modifier (an If inside score_mod) are not
// supported: GraphError.
#pragma once

#include "kiln/graph.h"

namespace kiln {

// Expands every FlexAttention with score_mod or prob_mod in `graph` and its
// subgraphs; returns how many were expanded.
int expandFlexAttentionModifiers(Graph& graph);

}  // namespace kiln
