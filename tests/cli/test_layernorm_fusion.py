"""Decomposed LayerNormalization (ReduceMean, Sub, Pow, ReduceMean, Add
epsilon, Sqrt, Div, Mul gamma, Add beta), as exporters write it, compiled by
kiln into one LayerNormalization step (src/passes/layernorm_fusion.h) and
checked against onnxruntime on the unfused model."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save

RNG = np.random.default_rng(11)
SHAPE = [2, 5, 24]


def decomposed(square="Pow", affine=True, axes_input=False, opset=17):
    nodes = []
    if axes_input:
        nodes += [helper.make_node("ReduceMean", ["x", "axes"], ["m"]),
                  helper.make_node("ReduceMean", ["sq", "axes"], ["v"])]
    else:
        nodes += [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
                  helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1])]
    nodes += [helper.make_node("Sub", ["x", "m"], ["d"]),
              helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "Pow"
              else helper.make_node("Mul", ["d", "d"], ["sq"]),
              helper.make_node("Add", ["v", "eps"], ["ve"]),
              helper.make_node("Sqrt", ["ve"], ["s"]),
              helper.make_node("Div", ["d", "s"], ["n" if affine else "y"])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]), helper.make_node("Add", ["g", "beta"], ["y"])]
    # topological order for the checker
    order = ["m", "d", "sq", "v", "ve", "s", "n", "g", "y"]
    nodes.sort(key=lambda node: order.index(node.output[0]))
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(RNG.standard_normal(SHAPE[-1]).astype(np.float32), "gamma"),
             numpy_helper.from_array(RNG.standard_normal(SHAPE[-1]).astype(np.float32), "beta"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    return nodes, inits


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("affine", [True, False])
def test_decomposed_layernorm_is_one_step(kiln, tmp_path, square, affine):
    nodes, inits = decomposed(square, affine)
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits, tmp_path / "m.onnx")
    x = (RNG.standard_normal(SHAPE) * 3 + 1).astype(np.float32)
    result = compile_and_compare(kiln, tmp_path, {"x": x})
    compiled = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln")
    assert re.search(r"\b1 steps", compiled.stdout), compiled.stdout


def test_axes_as_input_opset18_is_fused(kiln, tmp_path):
    nodes, inits = decomposed(axes_input=True)
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits, tmp_path / "m.onnx", opset=18)
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(SHAPE).astype(np.float32)})
    compiled = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln")
    assert re.search(r"\b1 steps", compiled.stdout), compiled.stdout


def test_intermediate_read_elsewhere_is_not_fused(kiln, tmp_path):
    # The mean is also a graph output: the pattern must stay as it is.
    nodes, inits = decomposed()
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE),
          helper.make_tensor_value_info("m", TensorProto.FLOAT, SHAPE[:-1] + [1])], inits, tmp_path / "m.onnx")
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(SHAPE).astype(np.float32)})
    compiled = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln")
    steps = int(re.search(r"(\d+) steps", compiled.stdout).group(1))
    assert steps > 1


def test_opset_before_17_is_fused_too(kiln, tmp_path):
    # kiln, like onnxruntime, knows LayerNormalization at any opset.
    nodes, inits = decomposed()
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits, tmp_path / "m.onnx", opset=13)
    compiled = compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(SHAPE).astype(np.float32)})
    assert re.search(r"\b1 steps", compiled.stdout), compiled.stdout


def rms_decomposed(square, normalize, gamma):
    """T5's and LLaMA's RMS norm written out: x / sqrt(mean(x^2) + eps) (* gamma)."""
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]) if square == "Pow"
             else helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"])]
    out = "n" if gamma else "y"
    if normalize == "div":
        nodes.append(helper.make_node("Div", ["x", "s"], [out]))
    elif normalize == "one-over":
        nodes += [helper.make_node("Div", ["one", "s"], ["r"]), helper.make_node("Mul", ["x", "r"], [out])]
    else:
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["r", "x"], [out])]
    if gamma:
        nodes.append(helper.make_node("Mul", ["gamma", "n"], ["y"]))
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(RNG.standard_normal(SHAPE[-1]).astype(np.float32), "gamma")]
    return nodes, inits


@pytest.mark.parametrize("square,normalize,gamma", [("Pow", "one-over", True), ("Mul", "div", False),
                                                    ("Pow", "reciprocal", True)])
def test_decomposed_rms_norm_is_one_step(kiln, tmp_path, square, normalize, gamma):
    nodes, inits = rms_decomposed(square, normalize, gamma)
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits, tmp_path / "m.onnx", opset=13)
    x = (RNG.standard_normal(SHAPE) * 3 + 1).astype(np.float32)
    compile_and_compare(kiln, tmp_path, {"x": x}, rtol=1e-5, atol=1e-6)
    ir = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln", "--print-ir").stdout
    assert "kiln.RMSNormalization" in ir and "ReduceMean" not in ir, ir


def test_rms_norm_with_its_input_read_elsewhere_is_fused(kiln, tmp_path):
    """x also feeds a residual Add (as in every pre-norm block): the norm still fuses."""
    nodes, inits = rms_decomposed("Pow", "one-over", True)
    nodes[-1].output[0] = "normed"
    nodes.append(helper.make_node("Add", ["x", "normed"], ["y"]))
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits, tmp_path / "m.onnx", opset=13)
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    compile_and_compare(kiln, tmp_path, {"x": x}, rtol=1e-5, atol=1e-6)
    ir = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln", "--print-ir").stdout
    assert "kiln.RMSNormalization" in ir, ir


def test_mean_of_squares_read_elsewhere_is_not_fused(kiln, tmp_path):
    nodes, inits = rms_decomposed("Pow", "div", False)
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE),
          helper.make_tensor_value_info("v", TensorProto.FLOAT, SHAPE[:-1] + [1])], inits, tmp_path / "m.onnx",
         opset=13)
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(SHAPE).astype(np.float32)}, rtol=1e-5, atol=1e-6)
    ir = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln", "--print-ir").stdout
    assert "kiln.RMSNormalization" not in ir, ir
