"""com.microsoft.DynamicQuantizeLSTM, onnxruntime's dynamically quantized
LSTM, as onnxruntime's own quantization tool writes it (quantize_dynamic of
an LSTM model, weights per tensor and per channel, both directions) against
onnxruntime. kiln computes the products as onnxruntime does (u8 activations,
exact integer sums, the same scales): one step matches to 1e-5. The gates'
sigmoid and tanh differ from onnxruntime's in the last bits, which can flip
a later step's 8-bit rounding of h: over several steps the bound is 1e-2,
where the float LSTM on the same weights is 1.5e-2 away."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

import kiln

SEQ, BATCH, INPUT, HIDDEN = 9, 2, 40, 48


def float_lstm(path, seq=SEQ):
    rng = np.random.default_rng(5)
    g = 4 * HIDDEN
    inits = [numpy_helper.from_array(rng.uniform(-0.3, 0.3, (2, g, INPUT)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.uniform(-0.3, 0.3, (2, g, HIDDEN)).astype(np.float32), "R"),
             numpy_helper.from_array(rng.uniform(-0.2, 0.2, (2, 2 * g)).astype(np.float32), "B")]
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h", "y_c"], hidden_size=HIDDEN,
                            direction="bidirectional")
    graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, BATCH, INPUT])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("seq,bound", [(1, 1e-5), (SEQ, 1e-2)])
def test_dynamically_quantized_lstm_matches_onnxruntime(tmp_path, per_channel, seq, bound):
    float_lstm(tmp_path / "lstm.onnx", seq)
    quantize_dynamic(str(tmp_path / "lstm.onnx"), str(tmp_path / "lstm_int8.onnx"), op_types_to_quantize=["LSTM"],
                     per_channel=per_channel, weight_type=QuantType.QInt8)
    model = onnx.load(tmp_path / "lstm_int8.onnx")
    assert [n.op_type for n in model.graph.node if n.domain == "com.microsoft"] == ["DynamicQuantizeLSTM"]
    kiln.compile(tmp_path / "lstm_int8.onnx", tmp_path / "lstm_int8.kiln")
    runner = kiln.Runner(tmp_path / "lstm_int8.kiln")
    session = ort.InferenceSession(str(tmp_path / "lstm_int8.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    for _ in range(3):
        x = rng.standard_normal((seq, BATCH, INPUT)).astype(np.float32)
        ours = runner.run({"x": x})
        for output, want in zip(session.get_outputs(), session.run(None, {"x": x})):
            got = ours[output.name]
            error = np.max(np.abs(got - want)) / np.max(np.abs(want))
            assert error <= bound, f"{output.name}: {error:.3g}"


def test_weights_must_be_constants(tmp_path):
    float_lstm(tmp_path / "lstm.onnx")
    quantize_dynamic(str(tmp_path / "lstm.onnx"), str(tmp_path / "lstm_int8.onnx"), op_types_to_quantize=["LSTM"])
    model = onnx.load(tmp_path / "lstm_int8.onnx")
    node = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM")
    # R fed at run time: the kernel needs its weights at load.
    r = next(i for i in model.graph.initializer if i.name == node.input[2])
    model.graph.initializer.remove(r)
    model.graph.input.append(helper.make_tensor_value_info(r.name, r.data_type, list(r.dims)))
    onnx.save(model, tmp_path / "fed.onnx")
    with pytest.raises(Exception, match="must be constants"):
        kiln.compile(tmp_path / "fed.onnx", tmp_path / "fed.kiln")
        kiln.Runner(tmp_path / "fed.kiln")
