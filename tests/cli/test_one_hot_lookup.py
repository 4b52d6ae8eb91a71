"""one_hot(ids) @ W as TensorFlow and JAX export it (Cast(Equal(ids, range))
then MatMul) becomes a row lookup (passes/one_hot_lookup.h): the same
result as onnxruntime, ids outside [0, D) included (a zero row), without the
[..., D] one-hot tensor or the product. Cases where the rewrite must not
happen (a range that is not 0..D-1, a one-hot read elsewhere too) still
match onnxruntime."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save

RNG = np.random.default_rng(53)
DEPTH, WIDTH = 19, 6


def steps(compiled):
    return int(re.search(r"(\d+) steps?,", compiled.stdout).group(1))


def one_hot_model(tmp_path, ids_type, range_values, ids_first=True, extra_reader=False):
    np_type = np.int64 if ids_type == TensorProto.INT64 else np.int32
    equal_inputs = ["ids", "range"] if ids_first else ["range", "ids"]
    nodes = [helper.make_node("Equal", equal_inputs, ["hot"]),
             helper.make_node("Cast", ["hot"], ["onehot"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["onehot", "w"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, WIDTH])]
    if extra_reader:
        nodes.append(helper.make_node("ReduceSum", ["onehot"], ["count"], keepdims=0))
        outputs.append(helper.make_tensor_value_info("count", TensorProto.FLOAT, []))
    inits = [numpy_helper.from_array(np.asarray(range_values, np_type).reshape(1, 1, DEPTH), "range"),
             numpy_helper.from_array(RNG.standard_normal((DEPTH, WIDTH)).astype(np.float32), "w")]
    save(nodes, [helper.make_tensor_value_info("ids", ids_type, [2, 5, 1])], outputs, inits, tmp_path / "m.onnx")
    # ids inside the range, and outside it on both sides (no position set).
    ids = RNG.integers(0, DEPTH, (2, 5, 1)).astype(np_type)
    ids[0, 0, 0], ids[1, 2, 0], ids[1, 4, 0] = -1, DEPTH, -DEPTH
    return {"ids": ids}


@pytest.mark.parametrize("ids_type", [TensorProto.INT64, TensorProto.INT32])
@pytest.mark.parametrize("ids_first", [True, False])
def test_one_hot_matmul_is_a_row_lookup(kiln, tmp_path, ids_type, ids_first):
    feeds = one_hot_model(tmp_path, ids_type, np.arange(DEPTH), ids_first)
    compiled = compile_and_compare(kiln, tmp_path, feeds, rtol=0, atol=0)
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "p.kiln", "--print-ir")
    assert "MatMul" not in result.stdout and "Gather" in result.stdout, result.stdout
    # The range checks on 10 ids (Less, Not, Less, And, Where), the Gather and
    # the Reshape into the graph output.
    assert steps(compiled) <= 7, compiled.stdout


@pytest.mark.parametrize("range_values,extra_reader", [
    (np.arange(DEPTH)[::-1], False),  # not 0..D-1: a permutation
    (np.arange(DEPTH), True),         # the one-hot is read elsewhere too
])
def test_other_one_hots_keep_their_matmul(kiln, tmp_path, range_values, extra_reader):
    feeds = one_hot_model(tmp_path, TensorProto.INT64, range_values, extra_reader=extra_reader)
    compile_and_compare(kiln, tmp_path, feeds)
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "p.kiln", "--print-ir")
    assert "MatMul" in result.stdout, result.stdout
