"""kiln.Session: run, run_with_outputs, create_host_outputs, the
[num_host_transfers, replication_factor, *shape] rule, variables with the
reference's lazy transfers (its example line by line), nested contexts, on
cpu and sim (docs/session.md)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

W0 = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.1
B = np.array([0, 1, 2], np.float32)


def reference(x, w):
    return x @ w.T + B


@pytest.fixture
def package(tmp_path):
    """y[2, 3] = x[2, 4] @ transpose(w) + b, w a variable (b a constant)."""
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(W0, "w"), numpy_helper.from_array(B, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", variables=["w"])
    return tmp_path / "m.kiln"


def test_the_references_lazy_transfer_example_line_by_line(package, device):
    session = kiln.Session(package, device)
    assert session.variables == {"w": ((3, 4), "f32")} and session.constants == {"b": ((3,), "f32")}
    counts = lambda: (session.weights_to_host_count, session.weights_from_host_count)  # noqa: E731
    x = np.random.default_rng(0).standard_normal((2, 4), np.float32)
    new1, new2 = np.full((3, 4), 0.5, np.float32), np.arange(12, dtype=np.float32).reshape(3, 4) - 6

    # Allowed when detached, device weights will be updated on next context enter
    session.write_variable_data("w", new1)
    assert counts() == (0, 0)
    with session:
        assert counts() == (0, 1)
        # No weights_to_host as no `run` has invalidated the host weights yet
        np.testing.assert_array_equal(session.get_tensor_data("w"), new1)
        assert counts() == (0, 1)
        outputs = session.run({"x": x})
        np.testing.assert_allclose(outputs["y"], reference(x, new1), rtol=1e-6)
        # No weights_to_host, is constant
        np.testing.assert_array_equal(session.get_tensor_data("b"), B)
        assert counts() == (0, 1)
        # Causes weights_to_host as host weights currently out-of-sync
        datas = session.get_tensors_data(["w", "b"])
        np.testing.assert_array_equal(datas["w"], new1)
        assert counts() == (1, 1)
        # Performs weights_from_host
        session.write_variable_data("w", new2)
        assert counts() == (1, 2)
        # No weights_to_host, write_variable_data did not invalidate
        np.testing.assert_array_equal(session.get_tensor_data("w"), new2)
        assert counts() == (1, 2)
        outputs = session.run({"x": x})
        np.testing.assert_allclose(outputs["y"], reference(x, new2), rtol=1e-6)
    # Leave context, causes detach and weights_to_host
    assert counts() == (2, 2) and not session.is_attached
    # No weights_to_host as detached. Latest weights were already fetched due to leaving context
    tensor_datas = session.get_tensors_data(["w", "b"])
    np.testing.assert_array_equal(tensor_datas["w"], new2)
    assert counts() == (2, 2)


def test_nested_contexts_attach_and_detach_once(package, device):
    session = kiln.Session(package, device)
    with session:  # Enter Ctxt 1, causes attach, weights_from_host
        assert session.is_attached and session.weights_from_host_count == 1
        with session:  # Enter Ctxt 2, still attached, no weights_from_host again
            assert session.is_attached and session.weights_from_host_count == 1
            session.run({"x": np.zeros((2, 4), np.float32)})
        # Exit Ctxt 2, no detach or weights_to_host, as attached on enter
        assert session.is_attached and session.weights_to_host_count == 0
    # Exit Ctxt 1, causes detach and weights_to_host as detached on enter
    assert not session.is_attached and session.weights_to_host_count == 1


def test_host_transfers_and_replicas_shape_the_data(package, device):
    session = kiln.Session(package, device, replication_factor=2, num_host_transfers=3)
    x = np.random.default_rng(1).standard_normal((3, 2, 2, 4), np.float32)
    assert session.host_shape((2, 4)) == (3, 2, 2, 4)
    outputs = session.create_host_outputs()
    assert outputs["y"].shape == (3, 2, 2, 3)
    with session:
        session.run_with_outputs({"x": x}, outputs)
        assert session.main_runs == 6
    np.testing.assert_allclose(outputs["y"], reference(x, W0), rtol=1e-5, atol=1e-6)
    # One of the two leading dimensions: the other is left out when it is 1.
    single = kiln.Session(package, device, num_host_transfers=4)
    assert single.host_shape((2, 4)) == (4, 2, 4)
    with single:
        y = single.run({"x": x[:, 0].copy()[[0, 1, 2, 0]]})["y"]
    np.testing.assert_allclose(y, reference(x[:, 0][[0, 1, 2, 0]], W0), rtol=1e-5, atol=1e-6)


def test_bad_data_names_the_anchor_and_the_expected_shape(package, device):
    session = kiln.Session(package, device, num_host_transfers=2)
    with pytest.raises(kiln.Error, match="not attached"):
        session.run({"x": np.zeros((2, 2, 4), np.float32)})
    with session:
        with pytest.raises(kiln.Error, match=r"input 'x' must have shape \(2, 2, 4\) \(\[num_host_transfers=2, "
                                             r"replication_factor=1\] \+ \[2, 4\]"):
            session.run({"x": np.zeros((2, 4), np.float32)})
        with pytest.raises(kiln.Error, match="input 'x' must be float32, got float64"):
            session.run({"x": np.zeros((2, 2, 4))})
        with pytest.raises(kiln.Error, match=r"unknown \['z'\], missing \['x'\]"):
            session.run({"z": np.zeros((2, 2, 4), np.float32)})
        outputs = session.create_host_outputs()
        outputs["y"] = outputs["y"][:, :, :2]
        with pytest.raises(kiln.Error, match="output 'y' must have shape"):
            session.run_with_outputs({"x": np.zeros((2, 2, 4), np.float32)}, outputs)
        with pytest.raises(kiln.Error, match=r"'b' is not a variable of the model \(variables: \['w'\]\)"):
            session.write_variable_data("b", B)
        with pytest.raises(kiln.Error, match=r"variable 'w' is float32 \(3, 4\), got float32 \(4, 3\)"):
            session.write_variable_data("w", W0.T)
        with pytest.raises(kiln.Error, match="no variable or constant named 'xw'"):
            session.get_tensor_data("xw")
        np.testing.assert_array_equal(session.get_tensor_data("w"), W0)  # nothing changed


def test_compile_refuses_a_variable_that_is_no_weight(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    with pytest.raises(kiln.Error, match="variable 'x' is not a weight"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", variables=["x"])
