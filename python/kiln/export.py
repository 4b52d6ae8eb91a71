"""Writing trained weights back into ONNX (Session.export_onnx): the model a
package with variables was compiled from, which the package keeps (the
opaque blob "source.onnx"), with each variable's current value in place of
its initializer, put back in inference mode, and optionally cut down to the
outputs an application wants (docs/training.md)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import numpy as np

from ._kiln import Error


def inference_model(source: bytes, values: Mapping[str, np.ndarray], outputs: Optional[Sequence[str]] = None,
                    batch: Union[int, str, None] = None):
    """The onnx.ModelProto of `source` with `values` (name -> array) as its initializers, BatchNormalization and
    Dropout in inference mode; with `outputs`, only what computes them (inputs no longer read are dropped); with
    `batch`, the leading dimension of every input and output replaced by it (a number, or a name to leave it
    open)."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = onnx.load_from_string(source)
    graph = model.graph
    for index, initializer in enumerate(graph.initializer):
        if initializer.name in values:
            graph.initializer[index].CopyFrom(numpy_helper.from_array(np.asarray(values[initializer.name]),
                                                                      initializer.name))
    _inference_mode(graph)
    if outputs is not None:
        _keep_only(model, list(outputs))
    if batch is not None:
        for value in list(graph.input) + list(graph.output):
            dims = value.type.tensor_type.shape.dim
            if len(dims) > 0:
                dims[0].Clear()
                if isinstance(batch, str):
                    dims[0].dim_param = batch
                else:
                    dims[0].dim_value = int(batch)
        del graph.value_info[:]  # inner shapes follow the new batch
    external = [i.name for i in graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise Error(f"the source model keeps initializers {external} in external data files, which the package does "
                    f"not hold; only variables are written back")
    return shape_inference.infer_shapes(model) if outputs is not None else model


def _inference_mode(graph) -> None:
    """Training packages put every BatchNormalization and Dropout in training mode; the export is for inference."""
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "BatchNormalization":
            for attribute in list(node.attribute):
                if attribute.name == "training_mode":
                    node.attribute.remove(attribute)
            del node.output[1:]
        elif node.op_type == "Dropout" and len(node.input) > 2:
            del node.input[2:]  # no training_mode: Dropout passes its input through


def _keep_only(model, outputs: Sequence[str]) -> None:
    from onnx import shape_inference

    graph = model.graph
    inferred = shape_inference.infer_shapes(model).graph
    types = {v.name: v for v in list(inferred.value_info) + list(inferred.output) + list(inferred.input)}
    missing = [name for name in outputs if name not in types]
    if missing:
        raise Error(f"export: {missing} are not values of the model (it has outputs "
                    f"{[o.name for o in graph.output]})")
    needed, kept = set(outputs), []
    for node in reversed(list(graph.node)):
        if any(output in needed for output in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    new_outputs = [types[name] for name in outputs]
    del graph.output[:]
    graph.output.extend(new_outputs)
    for field in (graph.input, graph.initializer):
        unused = [v for v in field if v.name not in needed]
        for value in unused:
            field.remove(value)
