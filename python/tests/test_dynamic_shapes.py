"""Run-time shapes: one package, compiled with symbolic batch and sequence
dimensions, runs every size; outputs match onnxruntime; the plan cache and
the shared arena behave as documented (kiln/dynamic_executor.h)."""

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

HIDDEN, HEADS = 64, 4


def attention_block(path):
    """x[batch, seq, 64] -> 4-head self-attention -> residual -> LayerNorm,
    with the head reshapes computed from Shape(x) as exporters write them."""
    rng = np.random.default_rng(0)
    weights = {name: (rng.standard_normal((HIDDEN, HIDDEN)) / 8).astype(np.float32) for name in ("Wq", "Wk", "Wv")}
    inits = [numpy_helper.from_array(w, name) for name, w in weights.items()]
    inits += [numpy_helper.from_array(np.array([0, 1], np.int64), "first_two"),
              numpy_helper.from_array(np.array([HEADS, HIDDEN // HEADS], np.int64), "heads"),
              numpy_helper.from_array(np.array([HIDDEN], np.int64), "hidden"),
              numpy_helper.from_array(np.array(0.25, np.float32), "scale"),
              numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "gamma"),
              numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "beta")]
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["x_shape"]),
             n("Gather", ["x_shape", "first_two"], ["batch_seq"], axis=0),
             n("Concat", ["batch_seq", "heads"], ["split_shape"], axis=0),
             n("Concat", ["batch_seq", "hidden"], ["merge_shape"], axis=0)]
    for name in ("q", "k", "v"):
        nodes += [n("MatMul", ["x", "W" + name], [name]),
                  n("Reshape", [name, "split_shape"], [name + "_heads"]),
                  n("Transpose", [name + "_heads"], [name + "_t"], perm=[0, 2, 1, 3])]
    nodes += [n("Transpose", ["k_heads"], ["k_tt"], perm=[0, 2, 3, 1]),
              n("MatMul", ["q_t", "k_tt"], ["scores"]),
              n("Mul", ["scores", "scale"], ["scaled"]),
              n("Softmax", ["scaled"], ["probs"], axis=-1),
              n("MatMul", ["probs", "v_t"], ["context"]),
              n("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
              n("Reshape", ["context_t", "merge_shape"], ["merged"]),
              n("Add", ["merged", "x"], ["residual"]),
              n("LayerNormalization", ["residual", "gamma", "beta"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture
def attention(tmp_path):
    model = attention_block(tmp_path / "attention.onnx")
    report = kiln.compile(model, tmp_path / "attention.kiln", dynamic=True)
    assert report["runtime_shapes"]
    return model, tmp_path / "attention.kiln"


def test_one_package_runs_every_batch_and_sequence_length(attention):
    model, package = attention
    runner = kiln.Runner(package)
    assert runner.dynamic
    assert runner.inputs == [("x", (-1, -1, HIDDEN), "f32")]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    arenas = []
    signatures = list(itertools.product([1, 7, 32], [16, 128, 384]))
    for batch, seq in signatures:
        x = rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)
        ours = runner.run({"x": x})["y"]
        (theirs,) = session.run(None, {"x": x})
        assert ours.shape == (batch, seq, HIDDEN)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
        arenas.append(runner.memory_stats()["arena_bytes"])
    stats = runner.memory_stats()
    assert stats["plan_cache_misses"] == len(signatures)
    assert stats["cached_plans"] == len(signatures)
    # The arena grows to the largest plan seen and never shrinks by itself.
    assert arenas == sorted(arenas) and arenas[-1] > arenas[0]
    # The same signature again: a cache hit, no compile, same arena.
    x = rng.standard_normal((7, 128, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(runner.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    after = runner.memory_stats()
    assert after["plan_cache_misses"] == len(signatures)
    assert after["plan_cache_hits"] == stats["plan_cache_hits"] + 1
    assert after["arena_bytes"] == stats["arena_bytes"]
    runner.shrink()
    assert runner.memory_stats()["arena_bytes"] == 0 and runner.memory_stats()["cached_plans"] == 0
    np.testing.assert_allclose(runner.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert 0 < runner.memory_stats()["arena_bytes"] < stats["arena_bytes"]


def test_plan_cache_is_bounded(attention):
    _, package = attention
    runner = kiln.Runner(package, plan_cache_capacity=2)
    for seq in (3, 4, 5, 3):
        runner.run({"x": np.zeros((1, seq, HIDDEN), np.float32)})
    stats = runner.memory_stats()
    assert (stats["plan_cache_misses"], stats["plan_cache_evictions"], stats["cached_plans"]) == (4, 2, 2)


def test_inputs_that_do_not_fit_are_refused(attention):
    _, package = attention
    runner = kiln.Runner(package)
    with pytest.raises(kiln.Error, match=r"input 'x' must have shape \(\?, \?, 64\)"):
        runner.run({"x": np.zeros((2, 3, 65), np.float32)})
    with pytest.raises(kiln.Error, match="must have shape"):
        runner.run({"x": np.zeros((2, 64), np.float32)})
    with pytest.raises(kiln.Error, match="must be float32"):
        runner.run({"x": np.zeros((2, 3, 64), np.float64)})
    assert runner.memory_stats()["plan_cache_misses"] == 0


def test_without_dynamic_unknown_dimensions_are_fixed_at_run_time_with_a_warning(tmp_path):
    model = attention_block(tmp_path / "attention.onnx")
    with pytest.warns(UserWarning, match="is not fixed: shapes are fixed at run time"):
        report = kiln.compile(model, tmp_path / "a.kiln")
    assert report["runtime_shapes"] and kiln.Runner(tmp_path / "a.kiln").dynamic
    # Fixed shapes still give a static package with a step program.
    report = kiln.compile(model, tmp_path / "a.kiln", shapes={"x": [2, 8, HIDDEN]})
    assert not report["runtime_shapes"] and report["steps"] > 0
    assert not kiln.Runner(tmp_path / "a.kiln").dynamic


def test_shape_read_from_an_input_value(tmp_path):
    """Reshape's target is a model input: its values are part of the
    signature, and every target gives onnxruntime's answer."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)],
        "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
                    helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "reshape.onnx")
    assert kiln.compile(tmp_path / "reshape.onnx", tmp_path / "reshape.kiln")["runtime_shapes"]
    runner = kiln.Runner(tmp_path / "reshape.kiln")
    session = ort.InferenceSession(str(tmp_path / "reshape.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    for target in ([2, 12], [12, 2], [-1, 3], [24, 1]):
        feeds = {"x": x, "shape": np.array(target, np.int64)}
        ours = runner.run(feeds)["y"]
        (theirs,) = session.run(None, feeds)
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert runner.memory_stats()["plan_cache_misses"] == 4
    with pytest.raises(kiln.Error, match="cannot run model"):
        runner.run({"x": x, "shape": np.array([5, 5], np.int64)})
