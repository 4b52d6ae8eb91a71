// Loop-invariant code motion: work in a Loop body that reads nothing that
// changes from one iteration to the next moves out of the Loop and runs
// once.
//
// For each Loop of the graph (its own; Loops inside a body are treated when
// that body is compiled, as a graph of its own):
//  1. A carried value that the body gives back unchanged (body output 1+k is
//     body input 2+k) holds the Loop's initial value in every iteration:
//     exporters carry weights through Loops that way (SLANet's decoder
//     carries its GRU and projection weights). The body's nodes then read
//     the initial value by name from the enclosing graph instead.
//  2. A body node of the default domain, without subgraphs and not random,
//     whose inputs are body initializers, values read from enclosing graphs
//     or outputs of nodes already moved, and whose outputs are not body
//     outputs, moves into the enclosing graph (before the Loop: a node
//     waits for the values its subgraphs read, see Graph::topologicalOrder);
//     the body reads its outputs by name. SLANet's decoder transposes its
//     weights and projects the encoder's features once instead of at each of
//     its up to 501 steps.
// A moved node runs even when the Loop runs no iteration. A node is left in
// place when its outputs' names are taken in the enclosing graph, or when
// it reads a value the enclosing graph cannot see by name. The body is
// copied before it changes (subgraphs are shared between graph copies).
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Returns the number of reads redirected and nodes moved. Types must have
// been inferred.
size_t hoistLoopInvariants(Graph& graph);

}  // namespace kiln
