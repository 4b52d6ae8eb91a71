"""Operators that move no element become views, not steps (compiler.cc,
isView; passes/transpose_composition.h): a Transpose of a Transpose is one
Transpose (or none), a Transpose that only moves axes of size 1, a Slice
that keeps everything and a Cast to the input's own type cost nothing. Each
model ends in a Relu, so that the view is not the graph output (which is
copied), and is checked against onnxruntime."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save

RNG = np.random.default_rng(31)


def steps(compiled):
    return int(re.search(r"(\d+) steps?,", compiled.stdout).group(1))


def build(kiln, tmp_path, nodes, shape, out_shape, inits=()):
    save(nodes + [helper.make_node("Relu", ["v"], ["y"])],
         [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], list(inits), tmp_path / "m.onnx")
    return compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("p1,p2,shape,out_shape,want", [
    ([0, 2, 1, 3], [0, 2, 1, 3], [2, 3, 4, 5], [2, 3, 4, 5], 1),   # inverse pair: nothing moves
    ([0, 2, 1, 3], [0, 2, 3, 1], [1, 6, 5, 1], [1, 6, 1, 5], 1),   # Magika's: only a unit axis moves
    ([0, 2, 1, 3], [0, 1, 3, 2], [2, 3, 4, 5], [2, 4, 5, 3], 2),   # one real Transpose left
])
def test_transposes_of_transposes_compose(kiln, tmp_path, p1, p2, shape, out_shape, want):
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=p1), helper.make_node("Transpose", ["t"], ["v"], perm=p2)]
    assert steps(build(kiln, tmp_path, nodes, shape, out_shape)) == want


def test_a_transpose_of_unit_axes_is_a_view(kiln, tmp_path):
    nodes = [helper.make_node("Transpose", ["x"], ["v"], perm=[0, 3, 1, 2])]
    assert steps(build(kiln, tmp_path, nodes, [2, 7, 5, 1], [2, 1, 7, 5])) == 1


@pytest.mark.parametrize("step,want", [(1, 1), (-1, 2)])
def test_a_slice_of_everything_is_a_view_unless_it_reverses(kiln, tmp_path, step, want):
    big = np.iinfo(np.int64).max
    starts, ends = ([0], [big]) if step == 1 else ([-1], [-big])
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("starts", starts), ("ends", ends), ("axes", [1]), ("steps", [step]))]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["v"])]
    assert steps(build(kiln, tmp_path, nodes, [3, 8], [3, 8], inits)) == want


def test_a_cast_to_the_same_type_is_a_view(kiln, tmp_path):
    nodes = [helper.make_node("Cast", ["x"], ["v"], to=TensorProto.FLOAT)]
    assert steps(build(kiln, tmp_path, nodes, [4, 6], [4, 6])) == 1
