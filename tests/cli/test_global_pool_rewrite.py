"""ReduceMean and ReduceMax over an image's spatial axes (keepdims=1) become
GlobalAveragePool and GlobalMaxPool (passes/global_pool_rewrite.h), which
the channels-last pass keeps in NHWC: a PyTorch-exported squeeze-excite
block runs without Transposes back to NCHW. Checked against onnxruntime;
other reductions (keepdims=0, other axes) keep their meaning."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save

RNG = np.random.default_rng(61)
F = TensorProto.FLOAT
C = 12  # not a multiple of 16: no blocked (Winograd) layout in between


def steps(compiled):
    return int(re.search(r"(\d+) steps?,", compiled.stdout).group(1))


def se_block(tmp_path, reduce_op, axes, keepdims, opset, se=True):
    """Conv -> Relu -> x * Sigmoid(Conv1x1(Reduce(x))) -> Conv."""
    attrs = {"keepdims": keepdims}
    inputs = ["r"]
    inits = [numpy_helper.from_array(RNG.standard_normal((C, C, 3, 3)).astype(np.float32) * 0.2, "w1"),
             numpy_helper.from_array(RNG.standard_normal((C, C, 1, 1)).astype(np.float32) * 0.2, "w2"),
             numpy_helper.from_array(RNG.standard_normal((C, C, 3, 3)).astype(np.float32) * 0.2, "w3")]
    if opset >= 18:
        inputs.append("axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    else:
        attrs["axes"] = axes
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node(reduce_op, inputs, ["pooled"], **attrs)]
    if se:
        nodes += [helper.make_node("Conv", ["pooled", "w2"], ["g"]),
                  helper.make_node("Sigmoid", ["g"], ["s"]),
                  helper.make_node("Mul", ["r", "s"], ["m"]),
                  helper.make_node("Conv", ["m", "w3"], ["y"], pads=[1, 1, 1, 1])]
        out = [helper.make_tensor_value_info("y", F, [1, C, 12, 10])]
    else:
        nodes.append(helper.make_node("Identity", ["pooled"], ["y"]))
        shape = [1, C, 12, 10]
        kept = [1 if d in [a % 4 for a in axes] else n for d, n in enumerate(shape)]
        out = [helper.make_tensor_value_info("y", F, kept if keepdims else [n for d, n in enumerate(shape)
                                                                            if d not in [a % 4 for a in axes]])]
    save(nodes, [helper.make_tensor_value_info("x", F, [1, C, 12, 10])], out, inits, tmp_path / "m.onnx", opset=opset)
    return {"x": RNG.standard_normal((1, C, 12, 10)).astype(np.float32)}


@pytest.mark.parametrize("reduce_op", ["ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("axes,opset", [([2, 3], 17), ([-1, -2], 17), ([2, 3], 18)])
def test_spatial_reductions_stay_channels_last(kiln, tmp_path, reduce_op, axes, opset):
    feeds = se_block(tmp_path, reduce_op, axes, 1, opset)
    compiled = compile_and_compare(kiln, tmp_path, feeds)
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "p.kiln", "--print-ir")
    assert reduce_op not in result.stdout and "Global" in result.stdout, result.stdout
    # x in and y out are the only Transposes: the block stays in NHWC.
    assert result.stdout.count("= Transpose(") == 2, result.stdout


@pytest.mark.parametrize("axes,keepdims", [([2, 3], 0), ([1, 2], 1)])
def test_other_reductions_keep_their_op(kiln, tmp_path, axes, keepdims):
    feeds = se_block(tmp_path, "ReduceMean", axes, keepdims, 17, se=False)
    compile_and_compare(kiln, tmp_path, feeds)
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "p.kiln", "--print-ir")
    assert "ReduceMean" in result.stdout, result.stdout
