"""Every gradient rule of kiln against JAX (issue 15: "every gradient rule against JAX").

kiln differentiates ONNX graphs with one hand-written rule per operator
(src/training/gradient_rules.cc). Each case below is a small model in which one
operator lies between the loss and the values differentiated: kiln compiles and
runs its gradients (kiln.compile(gradients_of="loss", wrt=...)), and jax.grad
differentiates the same ONNX graph, evaluated by the small ONNX -> jax.numpy
interpreter below (written from the ONNX operator specifications, in float64).
kiln's float32 gradients must match to float32 precision, and so must the loss
itself (which shows the interpreter and kiln agree on the forward, so that a
gradient mismatch is the rule's).

Every model ends in loss = ReduceSum(y * upstream), y the operator's output and
upstream a fixed random tensor fed as an input: the rule then receives a random
upstream gradient, not ones, so a linear operator's rule (Reshape, Concat, ...)
or a normalisation's (whose input gradient is zero under ones) is checked as
closely as any other.

test_every_rule_has_a_jax_case compares the rules the cases cover with the
list kiln gives, so a rule added later without a case here fails it. Dropout's
random mask is the one kiln drew (the model outputs it), which JAX then applies.
test_gradients.py checks the same rules against finite differences.
"""

import dataclasses
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

import kiln

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax
jax.config.update("jax_platforms", "cpu")

# kiln computes in float32, JAX in float64 from the same float32 values.
RTOL, ATOL = 1e-4, 1e-5

# ------------------------------------------------------------------ ONNX -> jax.numpy


def _axes(inputs, attrs, rank):
    """A node's axes (input 1 from opset 13/18, else the attribute), normalised; None when it gives none."""
    axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("axes")
    return None if axes is None or len(axes) == 0 else tuple(int(a) % rank for a in axes)


def _reduce(fn):
    def op(inputs, attrs):
        x = inputs[0]
        axes = _axes(inputs, attrs, x.ndim)
        if axes is None and attrs.get("noop_with_empty_axes", 0):
            return x
        return fn(x, axis=axes, keepdims=bool(attrs.get("keepdims", 1)))
    return op


def _reshape(inputs, attrs):
    x, shape = inputs
    # 0 copies the input's dimension (unless allowzero), -1 is inferred.
    return x.reshape([x.shape[i] if d == 0 and not attrs.get("allowzero", 0) else int(d) for i, d in enumerate(shape)])


def _flatten(inputs, attrs):
    x = inputs[0]
    axis = attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), -1)


def _unsqueeze(inputs, attrs):
    x = inputs[0]
    axes = inputs[1] if len(inputs) > 1 else attrs["axes"]
    for axis in sorted(int(a) % (x.ndim + len(axes)) for a in axes):  # axes of the output
        x = jnp.expand_dims(x, axis)
    return x


def _slice(inputs, attrs):
    x, starts, ends = inputs[:3]
    axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else range(len(starts))
    steps = inputs[4] if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        assert step > 0, "Python's slices clamp like ONNX's for positive steps only"
        index[int(axis) % x.ndim] = slice(int(start), int(end), int(step))
    return x[tuple(index)]


def _gather(inputs, attrs):
    data, indices = inputs
    axis = attrs.get("axis", 0) % data.ndim
    return jnp.take(data, np.where(indices < 0, indices + data.shape[axis], indices), axis=axis)


def _gemm(inputs, attrs):
    a, b = inputs[:2]
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = attrs.get("alpha", 1.0) * (a @ b)
    return y if len(inputs) < 3 or inputs[2] is None else y + attrs.get("beta", 1.0) * inputs[2]


def _conv(inputs, attrs):
    x, w = inputs[:2]
    spatial = x.ndim - 2
    assert attrs.get("auto_pad", "NOTSET") == "NOTSET"
    pads = attrs.get("pads", [0] * 2 * spatial)
    y = lax.conv_general_dilated(x, w, window_strides=attrs.get("strides", [1] * spatial),  # NC..., OI...
                                 padding=[(pads[i], pads[i + spatial]) for i in range(spatial)],
                                 rhs_dilation=attrs.get("dilations", [1] * spatial),
                                 feature_group_count=attrs.get("group", 1), precision=lax.Precision.HIGHEST)
    return y if len(inputs) < 3 or inputs[2] is None else y + inputs[2].reshape((1, -1) + (1,) * spatial)


def _pool(average):
    def op(inputs, attrs):
        x, kernel = inputs[0], attrs["kernel_shape"]
        n = len(kernel)
        assert attrs.get("auto_pad", "NOTSET") == "NOTSET" and not attrs.get("ceil_mode", 0)
        pads = attrs.get("pads", [0] * 2 * n)
        window = dict(window_dimensions=(1, 1, *kernel), window_strides=(1, 1, *attrs.get("strides", [1] * n)),
                      padding=((0, 0), (0, 0), *[(pads[i], pads[i + n]) for i in range(n)]),
                      window_dilation=(1, 1, *attrs.get("dilations", [1] * n)))
        if not average:  # padding never wins a maximum
            return lax.reduce_window(x, np.array(-np.inf, x.dtype), lax.max, **window)
        total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, **window)
        if attrs.get("count_include_pad", 0):
            return total / math.prod(kernel)
        return total / lax.reduce_window(jnp.ones_like(x), np.array(0, x.dtype), lax.add, **window)
    return op


def _softmax_cross_entropy_loss(inputs, attrs):
    """scores [N, C, D...], labels [N, D...], optional class weights [C]; ignore_index: weight 0."""
    scores, labels = inputs[:2]
    ignored = labels == attrs["ignore_index"] if "ignore_index" in attrs else np.zeros(labels.shape, bool)
    safe = np.where(ignored, 0, labels)
    weight = (inputs[2][safe] if len(inputs) > 2 and inputs[2] is not None else 1.0) * ~ignored
    log_p = jax.nn.log_softmax(scores, axis=1)
    loss = -jnp.take_along_axis(log_p, np.expand_dims(safe, 1), axis=1).squeeze(1) * weight
    reduction = attrs.get("reduction", "mean")
    return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.sum() / np.sum(weight)


def _layer_normalization(inputs, attrs):
    x, scale = inputs[:2]
    axes = tuple(range(attrs.get("axis", -1) % x.ndim, x.ndim))
    mean = x.mean(axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(variance + attrs.get("epsilon", 1e-5)) * scale
    return y if len(inputs) < 3 or inputs[2] is None else y + inputs[2]


def _batch_normalization(inputs, attrs):
    x, scale, bias, mean, variance = inputs
    per_channel = (1, -1) + (1,) * (x.ndim - 2)

    def normalize(mean, variance):
        y = (x - mean.reshape(per_channel)) / jnp.sqrt(variance.reshape(per_channel) + attrs.get("epsilon", 1e-5))
        return y * scale.reshape(per_channel) + bias.reshape(per_channel)

    if not attrs.get("training_mode", 0):
        return normalize(mean, variance)
    # The batch's own statistics (the variance biased), and the running ones updated.
    axes = (0, *range(2, x.ndim))
    momentum = attrs.get("momentum", 0.9)
    batch_mean, batch_variance = x.mean(axes), x.var(axes)
    return (normalize(batch_mean, batch_variance), mean * momentum + batch_mean * (1 - momentum),
            variance * momentum + batch_variance * (1 - momentum))


def _dropout(inputs, attrs):
    x = inputs[0]
    ratio = float(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else 0.5
    training = len(inputs) > 2 and inputs[2] is not None and bool(inputs[2])
    if not training or ratio == 0:
        return x, np.ones(x.shape, bool)
    # JAX cannot repeat kiln's random stream: the mask is the one kiln drew (the model outputs it).
    mask = attrs["mask"]
    return x * mask / (1 - ratio), mask


OPS = {
    "Add": lambda i, a: i[0] + i[1], "Sub": lambda i, a: i[0] - i[1],
    "Mul": lambda i, a: i[0] * i[1], "Div": lambda i, a: i[0] / i[1],
    "Pow": lambda i, a: jnp.power(i[0], i[1]), "Neg": lambda i, a: -i[0], "Identity": lambda i, a: i[0],
    "Relu": lambda i, a: jnp.maximum(i[0], 0), "Sigmoid": lambda i, a: jax.nn.sigmoid(i[0]),
    "Tanh": lambda i, a: jnp.tanh(i[0]), "Exp": lambda i, a: jnp.exp(i[0]), "Log": lambda i, a: jnp.log(i[0]),
    "Sqrt": lambda i, a: jnp.sqrt(i[0]),
    "Cast": lambda i, a: i[0].astype(helper.tensor_dtype_to_np_dtype(a["to"])),
    "Reshape": _reshape, "Flatten": _flatten, "Unsqueeze": _unsqueeze,
    "Squeeze": lambda i, a: jnp.squeeze(i[0], _axes(i, a, i[0].ndim)),
    "Transpose": lambda i, a: jnp.transpose(i[0], a.get("perm")),  # default: reversed
    "Concat": lambda i, a: jnp.concatenate(i, axis=a["axis"]), "Slice": _slice, "Gather": _gather,
    "MatMul": lambda i, a: jnp.matmul(i[0], i[1], precision=lax.Precision.HIGHEST), "Gemm": _gemm,
    "Conv": _conv, "MaxPool": _pool(average=False), "AveragePool": _pool(average=True),
    "GlobalAveragePool": lambda i, a: i[0].mean(tuple(range(2, i[0].ndim)), keepdims=True),
    "ReduceSum": _reduce(jnp.sum), "ReduceMean": _reduce(jnp.mean),
    "Softmax": lambda i, a: jax.nn.softmax(i[0], axis=a.get("axis", -1)),
    "LogSoftmax": lambda i, a: jax.nn.log_softmax(i[0], axis=a.get("axis", -1)),
    "SoftmaxCrossEntropyLoss": _softmax_cross_entropy_loss,
    "LayerNormalization": _layer_normalization, "BatchNormalization": _batch_normalization, "Dropout": _dropout,
}


def evaluate(graph, env):
    """Runs the graph's nodes over env (name -> value), adding their outputs to it."""
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        if node.op_type == "Dropout" and len(node.output) > 1:
            attrs["mask"] = env.get(node.output[1])
        outputs = OPS[node.op_type]([env[name] if name else None for name in node.input], attrs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        assert len([o for o in node.output if o]) <= len(outputs), f"{node.op_type}: an output no case needs"
        env.update((name, value) for name, value in zip(node.output, outputs) if name)
    return env


def jax_loss_and_gradients(model, values, wrt):
    """loss and d loss / d v for v in wrt, by jax.grad over the interpreted graph in float64. values: every
    value the graph reads (feeds, initializers) and any outputs kiln drew at random (Dropout's mask)."""
    def as_jax(value):  # integers and booleans stay numpy: static shapes, axes and indices
        return jnp.asarray(value, jnp.float64) if value.dtype.kind == "f" else value

    with jax.enable_x64(True):
        constants = {name: as_jax(value) for name, value in values.items()}  # concrete (not traced) under jit
        params = {w: constants[w] for w in wrt}

        def loss(params):
            return evaluate(model.graph, constants | params)["loss"].reshape(())

        value, grads = jax.jit(jax.value_and_grad(loss))(params)  # one compilation: faster than op by op
        return float(value), {w: np.asarray(g) for w, g in grads.items()}


# ------------------------------------------------------------------ the cases

RNG = np.random.default_rng(0)


def normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def positive(*shape):
    return RNG.uniform(0.5, 1.5, shape).astype(np.float32)


def ints(*values):
    return np.array(values, np.int64)


@dataclasses.dataclass
class Case:
    name: str                  # the test's id: the operator, then what the case varies
    nodes: list                # compute "y" from the values below
    inputs: dict               # graph inputs (fed at run time)
    weights: dict = dataclasses.field(default_factory=dict)  # initializers (differentiated when float)
    constants: dict = dataclasses.field(default_factory=dict)  # initializers not differentiated: axes, shapes...
    outputs: tuple = ()        # further model outputs the JAX side reads (Dropout's mask)
    opset: int = 17

    @property
    def rule(self):
        return self.name.split("[")[0]

    @property
    def wrt(self):
        return [n for n, v in (self.inputs | self.weights).items() if v.dtype.kind == "f"]


def node(op, inputs, **attrs):
    return helper.make_node(op, inputs, ["y"], **attrs)


def unary(op, x):
    return Case(op, [node(op, ["x"])], {"x": x})


def binary(op, name, a, b):
    return Case(f"{op}[{name}]", [node(op, ["a", "b"])], {"a": a}, {"b": b})


def conv(name, x, w, bias=True, **attrs):
    weights = {"w": w} | ({"b": normal(w.shape[0]) * 0.1} if bias else {})
    return Case(f"Conv[{name}]", [node("Conv", ["x", *weights], **attrs)], {"x": x}, weights)


CASES = [
    # Elementwise, with broadcasting both ways.
    binary("Add", "a[2,1,4]+b[3,1]", normal(2, 1, 4), normal(3, 1)),
    binary("Sub", "a[3,4]-b[2,1,4]", normal(3, 4), normal(2, 1, 4)),
    binary("Mul", "a[2,3,4]*b[3,1]", normal(2, 3, 4), normal(3, 1)),
    binary("Div", "a[2,3,4]/b[4]", normal(2, 3, 4), positive(4) * np.float32([1, -1, 1, -1])),
    # Pow: the exponent a constant (kiln's rule differentiates the base only).
    Case("Pow[exponent_per_column]", [node("Pow", ["x", "p"])], {"x": positive(3, 4)},
         constants={"p": np.float32([0.5, 1.0, 2.0, 3.0])}),
    Case("Pow[cube_negative_base]", [node("Pow", ["x", "p"])], {"x": normal(3, 4)},
         constants={"p": np.array(3, np.float32)}),
    unary("Neg", normal(3, 4)), unary("Identity", normal(3, 4)), unary("Relu", normal(3, 4)),
    unary("Sigmoid", normal(3, 4) * 2), unary("Tanh", normal(3, 4)), unary("Exp", normal(3, 4)),
    unary("Log", positive(3, 4)), unary("Sqrt", positive(3, 4)),
    Case("Cast[float_to_double]", [node("Cast", ["x"], to=TensorProto.DOUBLE)], {"x": normal(3, 4)}),
    # Shapes and layouts.
    Case("Reshape[zero_and_minus_one]", [node("Reshape", ["x", "shape"])], {"x": normal(2, 3, 4)},
         constants={"shape": ints(4, 0, -1)}),
    Case("Flatten[axis=2]", [node("Flatten", ["x"], axis=2)], {"x": normal(2, 3, 2, 2)}),
    Case("Flatten[default_axis]", [node("Flatten", ["x"])], {"x": normal(2, 3, 4)}),
    Case("Squeeze[axes]", [node("Squeeze", ["x", "axes"])], {"x": normal(3, 1, 4, 1)}, constants={"axes": ints(1, -1)}),
    Case("Squeeze[all_ones]", [node("Squeeze", ["x"])], {"x": normal(1, 3, 1)}),
    Case("Unsqueeze[0,-1]", [node("Unsqueeze", ["x", "axes"])], {"x": normal(3, 4)}, constants={"axes": ints(0, -1)}),
    Case("Transpose[perm=2,0,1]", [node("Transpose", ["x"], perm=[2, 0, 1])], {"x": normal(2, 3, 4)}),
    Case("Transpose[default_perm]", [node("Transpose", ["x"])], {"x": normal(2, 3, 4)}),
    Case("Concat[three_on_axis_1]", [node("Concat", ["x", "w", "x2"], axis=1)],
         {"x": normal(2, 2, 3), "x2": normal(2, 3, 3)}, {"w": normal(2, 1, 3)}),
    Case("Concat[axis=-1]", [node("Concat", ["x", "w"], axis=-1)], {"x": normal(3, 2)}, {"w": normal(3, 4)}),
    Case("Slice[negative_and_clamped]", [node("Slice", ["x", "starts", "ends", "axes"])], {"x": normal(4, 5)},
         constants={"starts": ints(1, -3), "ends": ints(3, 100), "axes": ints(0, -1)}),
    Case("Slice[steps_of_1_no_axes]", [node("Slice", ["x", "starts", "ends", "", "steps"])], {"x": normal(5, 3)},
         constants={"starts": ints(1), "ends": ints(-1), "steps": ints(1)}),
    Case("Gather[embedding_repeated_ids]", [node("Gather", ["table", "ids"])], {"ids": ints([1, 4, 4], [9, 0, 1])},
         {"table": normal(10, 3)}),
    Case("Gather[axis1_scalar_index]", [node("Gather", ["x", "i"], axis=1)], {"x": normal(2, 4, 3)},
         constants={"i": np.array(0, np.int64)}),
    Case("Gather[axis2_negative_repeated]", [node("Gather", ["x", "i"], axis=-1)], {"x": normal(2, 3, 5)},
         constants={"i": ints([-1, 2], [2, 0])}),
    # Products.
    Case("MatMul[2d]", [node("MatMul", ["x", "w"])], {"x": normal(5, 4)}, {"w": normal(4, 3)}),
    Case("MatMul[3d@2d]", [node("MatMul", ["x", "w"])], {"x": normal(2, 5, 4)}, {"w": normal(4, 3)}),
    Case("MatMul[batch_broadcast_both]", [node("MatMul", ["x", "w"])], {"x": normal(2, 1, 5, 4)},
         {"w": normal(3, 4, 2)}),
    Case("Gemm[transA_transB_alpha_beta]", [node("Gemm", ["a", "b", "c"], transA=1, transB=1, alpha=0.7, beta=1.3)],
         {"a": normal(4, 5)}, {"b": normal(3, 4), "c": normal(3)}),
    Case("Gemm[C_column]", [node("Gemm", ["a", "b", "c"])], {"a": normal(5, 4)},
         {"b": normal(4, 3), "c": normal(5, 1)}),
    Case("Gemm[no_C_transB]", [node("Gemm", ["a", "b"], transB=1)], {"a": normal(5, 4)}, {"b": normal(3, 4)}),
    # Convolutions and pooling.
    conv("stride2_asymmetric_pads_bias", normal(2, 3, 7, 6), normal(4, 3, 3, 3) * 0.3, strides=[2, 2],
         pads=[1, 0, 2, 1]),
    conv("dilation2_stride3", normal(2, 3, 8, 8), normal(5, 3, 2, 2) * 0.3, bias=False, dilations=[2, 2],
         strides=[3, 3], pads=[1, 0, 1, 0]),
    conv("group=2", normal(2, 4, 5, 5), normal(6, 2, 3, 3) * 0.3, group=2, pads=[1, 1, 1, 1]),
    conv("depthwise", normal(2, 3, 6, 6), normal(3, 1, 3, 3) * 0.3, group=3, strides=[2, 2],
         pads=[1, 1, 1, 1]),
    conv("depthwise_multiplier2", normal(1, 3, 5, 5), normal(6, 1, 3, 3) * 0.3, bias=False, group=3),
    Case("MaxPool[2x2_tiles]", [node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2])],
         {"x": normal(2, 3, 4, 6)}),
    Case("MaxPool[2x3_tiles]", [node("MaxPool", ["x"], kernel_shape=[2, 3], strides=[2, 3])],
         {"x": normal(1, 2, 4, 6)}),
    Case("AveragePool[2x3_tiles]", [node("AveragePool", ["x"], kernel_shape=[2, 3], strides=[2, 3])],
         {"x": normal(2, 2, 4, 6)}),
    # Overlapping and padded windows (ResNet's stem pooling, and others).
    Case("MaxPool[3x3_stride2_pad1]", [node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": normal(2, 3, 7, 8)}),
    Case("MaxPool[2x2_stride1_asymmetric_pads]", [node("MaxPool", ["x"], kernel_shape=[2, 2], pads=[0, 1, 1, 0])],
         {"x": normal(1, 2, 5, 6)}),
    Case("AveragePool[3x3_stride2_pad1]",
         [node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": normal(2, 3, 7, 8)}),
    Case("AveragePool[3x2_pad_counted]",
         [node("AveragePool", ["x"], kernel_shape=[3, 2], pads=[1, 0, 1, 1], count_include_pad=1)],
         {"x": normal(1, 2, 5, 5)}),
    Case("GlobalAveragePool", [node("GlobalAveragePool", ["x"])], {"x": normal(2, 3, 4, 5)}),
    # Reductions.
    Case("ReduceSum[axis_1]", [node("ReduceSum", ["x", "axes"], keepdims=0)], {"x": normal(2, 3, 4)},
         constants={"axes": ints(1)}),
    Case("ReduceSum[axes_-1,0_keepdims]", [node("ReduceSum", ["x", "axes"])], {"x": normal(2, 3, 4)},
         constants={"axes": ints(-1, 0)}),
    Case("ReduceSum[all_axes]", [node("ReduceSum", ["x"])], {"x": normal(2, 3, 4)}),
    Case("ReduceMean[axes_attribute_opset17]", [node("ReduceMean", ["x"], axes=[1], keepdims=0)],
         {"x": normal(2, 3, 4)}),
    Case("ReduceMean[axes_input_opset18]", [node("ReduceMean", ["x", "axes"], keepdims=0)], {"x": normal(2, 3, 4)},
         constants={"axes": ints(0, 2)}, opset=18),
    # Normalisations and losses.
    Case("Softmax[axis=-1]", [node("Softmax", ["x"])], {"x": normal(3, 5)}),
    Case("Softmax[axis=1_of_3]", [node("Softmax", ["x"], axis=1)], {"x": normal(2, 4, 3)}),
    Case("LogSoftmax[axis=0]", [node("LogSoftmax", ["x"], axis=0)], {"x": normal(4, 3)}),
    Case("LogSoftmax[axis=-1_of_3]", [node("LogSoftmax", ["x"], axis=-1)], {"x": normal(2, 3, 5)}),
    *[Case(f"SoftmaxCrossEntropyLoss[{reduction}]", [node("SoftmaxCrossEntropyLoss", ["x", "labels"],
                                                           reduction=reduction)],
           {"x": normal(6, 4), "labels": ints(0, 3, 1, 1, 2, 3)}) for reduction in ("mean", "sum", "none")],
    *[Case(f"SoftmaxCrossEntropyLoss[weights_ignore_index_{reduction}]",
           [node("SoftmaxCrossEntropyLoss", ["x", "labels", "w"], reduction=reduction, ignore_index=-100)],
           {"x": normal(6, 4), "labels": ints(0, -100, 1, 3, -100, 2)}, constants={"w": positive(4)})
      for reduction in ("mean", "sum", "none")],
    Case("SoftmaxCrossEntropyLoss[NCD_ignore_index_1]",
         [node("SoftmaxCrossEntropyLoss", ["x", "labels"], ignore_index=1)],
         {"x": normal(2, 4, 3), "labels": ints(0, 1, 3, 2, 2, 1).reshape(2, 3)}),
    Case("LayerNormalization[last_axis_bias]", [node("LayerNormalization", ["x", "scale", "bias"])],
         {"x": normal(2, 3, 4)}, {"scale": positive(4), "bias": normal(4)}),
    Case("LayerNormalization[axis=1_no_bias_eps]", [node("LayerNormalization", ["x", "scale"], axis=1, epsilon=1e-3)],
         {"x": normal(2, 3, 4)}, {"scale": positive(3, 4)}),
    # BatchNormalization's running statistics are constants: kiln's rule gives them no gradient. In training mode ONNX requires the running-statistics outputs.
    Case("BatchNormalization[training_mode]",
         [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                           ["y", "running_mean", "running_var"], training_mode=1)],
         {"x": normal(4, 3, 2, 2)}, {"scale": positive(3), "bias": normal(3)},
         constants={"mean": normal(3), "var": positive(3)}),
    Case("BatchNormalization[inference_mode]",
         [node("BatchNormalization", ["x", "scale", "bias", "mean", "var"])],
         {"x": normal(4, 3, 2, 2)}, {"scale": positive(3), "bias": normal(3)},
         constants={"mean": normal(3), "var": positive(3)}),
    Case("Dropout[not_training]", [node("Dropout", ["x"])], {"x": normal(3, 4)}),
    Case("Dropout[seeded_ratio_0.5]",
         [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], seed=7)],
         {"x": normal(4, 5)}, constants={"ratio": np.array(0.5, np.float32), "training": np.array(True)},
         outputs=("mask",)),
]


def model_of(case):
    """The case's nodes, then loss = ReduceSum(y * upstream), upstream an input of y's shape (onnx's inference)."""
    def info(name, value):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)

    opsets = [helper.make_opsetid("", case.opset)]
    initializers = [numpy_helper.from_array(v, n) for n, v in (case.weights | case.constants).items()]
    body = helper.make_graph(case.nodes, "body", [info(n, v) for n, v in case.inputs.items()], [], initializers)
    inferred = {v.name: v for v in shape_inference.infer_shapes(helper.make_model(body, opset_imports=opsets),
                                                               strict_mode=True).graph.value_info}
    y = inferred["y"]
    upstream = helper.make_value_info("upstream", y.type)
    tail = [helper.make_node("Mul", ["y", "upstream"], ["weighted"]),
            helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
    graph = helper.make_graph(case.nodes + tail, case.name, list(body.input) + [upstream],
                              [helper.make_tensor_value_info("loss", y.type.tensor_type.elem_type, [])] +
                              [inferred[name] for name in case.outputs], initializers)
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def feeds_of(case, model):
    upstream = next(i for i in model.graph.input if i.name == "upstream").type.tensor_type
    shape = [d.dim_value for d in upstream.shape.dim]
    rng = np.random.default_rng(sum(map(ord, case.name)))
    dtype = helper.tensor_dtype_to_np_dtype(upstream.elem_type)
    return case.inputs | {"upstream": rng.standard_normal(shape).astype(dtype)}


def kiln_run(case, model, feeds, directory):
    onnx.save(model, directory / "m.onnx")
    kiln.compile(directory / "m.onnx", directory / "m.kiln", gradients_of="loss", wrt=case.wrt)
    return kiln.Runner(directory / "m.kiln").run(feeds)


# ------------------------------------------------------------------ kiln's rules


def kiln_rules():
    """kiln's rules, from the error differentiating through an operator without one (Python has no other list)."""
    if not hasattr(kiln_rules, "names"):
        for op in ("Sin", "Cos", "Atan", "Erf"):
            model = helper.make_model(helper.make_graph(
                [helper.make_node(op, ["x"], ["s"]), helper.make_node("ReduceSum", ["s"], ["loss"], keepdims=0)], "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]),
                opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
            with tempfile.TemporaryDirectory() as directory:
                onnx.save(model, Path(directory) / "m.onnx")
                try:
                    kiln.compile(Path(directory) / "m.onnx", Path(directory) / "m.kiln", gradients_of="loss", wrt=["x"])
                except kiln.Error as error:
                    found = re.search(r"no gradient rule for \w+ yet \(it has: ([^)]*)\)", str(error))
                    if found:
                        kiln_rules.names = set(found.group(1).split(", "))
                        break
        else:
            raise AssertionError("kiln has rules for Sin, Cos, Atan and Erf: name another op without one here")
    return kiln_rules.names


def param(case):
    return pytest.param(case, id=case.name)


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("case", [param(c) for c in CASES])
def test_gradient_matches_jax(tmp_path, case):
    model = model_of(case)
    feeds = feeds_of(case, model)
    got = kiln_run(case, model, feeds, tmp_path)
    drawn = {name: got[name] for name in case.outputs}  # Dropout's random mask, which JAX cannot repeat
    if "mask" in drawn:
        assert drawn["mask"].any() and not drawn["mask"].all(), "a mask that drops nothing or everything"
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    loss, want = jax_loss_and_gradients(model, initializers | feeds | drawn, case.wrt)
    np.testing.assert_allclose(got["loss"], loss, rtol=RTOL, atol=ATOL, err_msg="the loss (the forward)")
    for w in case.wrt:
        assert np.any(want[w] != 0), f"d loss / d {w} is zero: the case checks nothing"
        assert got[f"{w}_grad"].shape == want[w].shape
        np.testing.assert_allclose(got[f"{w}_grad"], want[w], rtol=RTOL, atol=ATOL, err_msg=f"d loss / d {w}")


def test_every_rule_has_a_jax_case():
    """The rules the cases cover are kiln's: a rule added later needs a case."""
    covered = {case.rule for case in CASES}
    assert sorted(kiln_rules() - covered) == [], "rules without a JAX case"
    assert sorted(covered - kiln_rules()) == [], "cases for rules kiln does not have"
