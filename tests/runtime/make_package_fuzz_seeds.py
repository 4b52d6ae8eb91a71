#!/usr/bin/env python3
"""Writes the package fuzz target's seeds (tests/runtime/package_fuzz_seeds):
small ONNX models compiled by kiln, each a few kilobytes, together covering
arena values, constants, views (aliases), fused elementwise steps, If, Loop,
Scan and a run-time-shape (graph) package.

    PYTHONPATH=build/release/python .venv/bin/python tests/runtime/make_package_fuzz_seeds.py
"""
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "package_fuzz_seeds")
F = TensorProto.FLOAT


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def model(name, nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    return name, helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def models():
    rng = np.random.default_rng(0)
    w = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    yield model("affine", [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ], [vi("x", F, [2, 4])], [vi("y", F, [2, 3])], [const("w", w(4, 3)), const("b", w(3))])
    yield model("conv", [
        helper.make_node("Conv", ["x", "k", "kb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "g"], ["y"]),
    ], [vi("x", F, [1, 2, 4, 4])], [vi("y", F, [1, 2])],
        [const("k", w(3, 2, 3, 3)), const("kb", w(3)), const("g", w(12, 2))])
    yield model("views", [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
        helper.make_node("Slice", ["t", "starts", "ends"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["g"], axis=0),
        helper.make_node("Concat", ["g", "g"], ["c"], axis=1),
        helper.make_node("Unsqueeze", ["c", "axes"], ["y"]),
    ], [vi("x", F, [2, 3, 2])], [vi("y", F, [1, 2, 4])],
        [const("shape", np.array([3, 4], np.int64)), const("starts", np.array([1], np.int64)),
         const("ends", np.array([3], np.int64)), const("idx", np.array([1, 0], np.int64)),
         const("axes", np.array([0], np.int64))])
    yield model("normalize", [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Softmax", ["n"], ["y"], axis=-1),
    ], [vi("x", F, [3, 5])], [vi("y", F, [3, 5])], [const("eps", np.array(1e-5, np.float32))])
    then_branch = helper.make_graph([helper.make_node("Add", ["x", "one"], ["t"])], "then", [],
                                    [vi("t", F, [4])], [const("one", np.ones(4, np.float32))])
    else_branch = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["e"])], "else", [], [vi("e", F, [4])])
    yield model("if", [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)],
                [vi("c", TensorProto.BOOL, []), vi("x", F, [4])], [vi("y", F, [4])])
    body = helper.make_graph([
        helper.make_node("Identity", ["cond"], ["cond_out"]),
        helper.make_node("Add", ["acc", "x"], ["acc_out"]),
        helper.make_node("Mul", ["acc_out", "half"], ["scan"]),
    ], "body", [vi("i", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []), vi("acc", F, [4])],
        [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", F, [4]), vi("scan", F, [4])],
        [const("half", np.float32(0.5))])
    yield model("loop", [helper.make_node("Loop", ["n", "", "a"], ["y", "ys"], body=body)],
                [vi("x", F, [4]), vi("a", F, [4])], [vi("y", F, [4]), vi("ys", F, [3, 4])],
                [const("n", np.array(3, np.int64))])
    scan_body = helper.make_graph([
        helper.make_node("Add", ["s", "xi"], ["s_out"]),
        helper.make_node("Tanh", ["s_out"], ["o"]),
    ], "scan_body", [vi("s", F, [2]), vi("xi", F, [2])], [vi("s_out", F, [2]), vi("o", F, [2])])
    yield model("scan", [helper.make_node("Scan", ["s0", "xs"], ["s", "os"], body=scan_body, num_scan_inputs=1)],
                [vi("s0", F, [2]), vi("xs", F, [5, 2])], [vi("s", F, [2]), vi("os", F, [5, 2])])
    yield model("dynamic", [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Sigmoid", ["xw"], ["y"]),
    ], [vi("x", F, ["n", 4])], [vi("y", F, ["n", 2])], [const("w", w(4, 2))])


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, onnx_model in models():
            onnx.checker.check_model(onnx_model)
            source = os.path.join(tmp, name + ".onnx")
            onnx.save(onnx_model, source)
            target = os.path.join(OUT, name + ".kiln")
            kiln.compile(source, target, dynamic=(name == "dynamic"))
            size = os.path.getsize(target)
            if size > 8192:
                sys.exit(f"{name}: {size} bytes, over the fuzzer's 8192-byte inputs")
            print(f"{target}: {size} bytes")


if __name__ == "__main__":
    main()
