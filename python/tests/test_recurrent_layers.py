"""RNN, GRU and LSTM against onnxruntime, over what real models use and what
the spec allows: both directions, both layouts, sequence lengths, initial
states, peepholes, clip, linear_before_reset and the optional activations
(with their alpha and beta). Sizes are not multiples of the vector width, so
the kernels' partial vectors run too. Bound: max|kiln - ort| / max|ort|."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

F = TensorProto.FLOAT
REL_TOLERANCE = 1e-5
SEQ, BATCH, INPUT, HIDDEN = 7, 3, 19, 37
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def recurrent_model(path, op, directions=1, layout=0, lens=False, initial=False, peepholes=False,
                    constant_weights=True, direction="forward", hidden=HIDDEN, **attrs):
    rng = np.random.default_rng(11)
    g = GATES[op] * hidden
    weights = {
        "W": rng.uniform(-0.4, 0.4, (directions, g, INPUT)).astype(np.float32),
        "R": rng.uniform(-0.4, 0.4, (directions, g, hidden)).astype(np.float32),
        "B": rng.uniform(-0.3, 0.3, (directions, 2 * g)).astype(np.float32),
    }
    x_shape = [SEQ, BATCH, INPUT] if layout == 0 else [BATCH, SEQ, INPUT]
    inputs = [helper.make_tensor_value_info("x", F, x_shape)]
    # Values are drawn in layout 0's shapes and transposed for layout 1, so
    # that both layouts of one configuration hold the same numbers.
    batch_major = (1, 0, 2) if layout == 1 else (0, 1, 2)
    feeds = {"x": rng.standard_normal([SEQ, BATCH, INPUT]).astype(np.float32).transpose(batch_major).copy()}
    initializers = []
    for name, value in weights.items():
        if constant_weights:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, F, list(value.shape)))
            feeds[name] = value
    names = ["x", "W", "R", "B", "", "", "", ""]
    if lens:
        initializers.append(numpy_helper.from_array(np.array([SEQ, 3, 1][:BATCH], np.int32), "lens"))
        names[4] = "lens"
    if initial:
        for name, index in (("h0", 5), ("c0", 6))[:2 if op == "LSTM" else 1]:
            value = rng.uniform(-1, 1, [directions, BATCH, hidden]).astype(np.float32).transpose(batch_major).copy()
            initializers.append(numpy_helper.from_array(value, name))
            names[index] = name
    if peepholes:
        initializers.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, (directions, 3 * hidden))
                                                    .astype(np.float32), "P"))
        names[7] = "P"
    while names[-1] == "":
        names.pop()
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    if directions == 2:
        direction = "bidirectional"
    node = helper.make_node(op, names, outputs, hidden_size=hidden, direction=direction, layout=layout, **attrs)
    graph = helper.make_graph([node], op.lower(), inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.save(model, path)
    return feeds


def check(tmp_path, op, layout=0, threads=0, **options):
    path = tmp_path / "layer.onnx"
    feeds = recurrent_model(path, op, layout=layout, **options)
    kiln.compile(path, tmp_path / "layer.kiln")
    ours = kiln.Runner(tmp_path / "layer.kiln", threads=threads).run(feeds)
    # onnxruntime refuses layout 1: its reference is the same layer in layout
    # 0, outputs transposed to [batch, seq, directions, hidden] and [batch,
    # directions, hidden].
    reference = tmp_path / "reference.onnx"
    reference_feeds = recurrent_model(reference, op, layout=0, **options)
    expected = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"]).run(None, reference_feeds)
    if layout == 1:
        expected = [expected[0].transpose(2, 0, 1, 3)] + [e.transpose(1, 0, 2) for e in expected[1:]]
    names = ["y", "y_h", "y_c"]
    for name, want in zip(names, expected):
        got = ours[name]
        assert got.shape == want.shape, name
        error = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
        assert error <= REL_TOLERANCE, f"{op} {options} {name}: relative error {error:.3g}"


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("directions,layout", [(1, 0), (2, 0), (2, 1)])
def test_directions_and_layouts(tmp_path, op, directions, layout):
    check(tmp_path, op, directions=directions, layout=layout, initial=True)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_reverse_with_sequence_lengths(tmp_path, op):
    check(tmp_path, op, direction="reverse", lens=True)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_bidirectional_sequence_lengths_and_weights_fed_at_run_time(tmp_path, op):
    check(tmp_path, op, directions=2, lens=True, initial=True, constant_weights=False)


# kiln keeps R^T in panels of 128 columns (kernels/cpu/recurrent.cc): hidden
# sizes whose gate blocks start inside a panel and end in the next one.
@pytest.mark.parametrize("op,hidden,attrs", [("GRU", 50, {}), ("GRU", 70, {"linear_before_reset": 1}),
                                             ("LSTM", 70, {}), ("RNN", 130, {})])
@pytest.mark.parametrize("constant_weights", [True, False])
def test_hidden_sizes_across_weight_panels(tmp_path, op, hidden, attrs, constant_weights):
    check(tmp_path, op, directions=2, initial=True, hidden=hidden, constant_weights=constant_weights, **attrs)


# With R of 1 MiB or more an LSTM or GRU splits its hidden units across the
# threads, each thread its own units' gate columns (kernels/cpu/recurrent.cc,
# stepsAcrossThreads); 300 units over 2 and 3 threads put the split inside a
# panel and leave a last part that is not a whole vector.
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("layout,constant_weights", [(0, True), (1, False)])
@pytest.mark.parametrize("op,attrs", [("LSTM", {"peepholes": True}), ("GRU", {}), ("GRU", {"linear_before_reset": 1})])
def test_split_across_threads(tmp_path, threads, layout, constant_weights, op, attrs):
    check(tmp_path, op, directions=2, layout=layout, hidden=300, lens=True, initial=True, clip=2.0,
          constant_weights=constant_weights, threads=threads, **attrs)


def test_gru_linear_before_reset(tmp_path):
    check(tmp_path, "GRU", directions=2, linear_before_reset=1, initial=True)


def test_lstm_peepholes_and_clip(tmp_path):
    check(tmp_path, "LSTM", directions=2, peepholes=True, clip=0.7, initial=True)


@pytest.mark.parametrize("op,activations,alpha,beta", [
    ("RNN", ["Relu"], [], []),
    ("RNN", ["Affine"], [0.5], [0.1]),
    ("RNN", ["LeakyRelu", "ThresholdedRelu"], [0.2, 0.3], []),
    ("GRU", ["HardSigmoid", "Softsign"], [0.3], [0.4]),
    ("GRU", ["Sigmoid", "Elu"], [0.8], []),
    ("LSTM", ["HardSigmoid", "ScaledTanh", "Softplus"], [0.25, 1.2], [0.5, 0.7]),
])
def test_optional_activations(tmp_path, op, activations, alpha, beta):
    options = {"activations": activations}
    if alpha:
        options["activation_alpha"] = alpha
    if beta:
        options["activation_beta"] = beta
    directions = 2 if len(activations) == 2 * {"RNN": 1, "GRU": 2, "LSTM": 3}[op] else 1
    check(tmp_path, op, directions=directions, **options)


def test_unknown_activation_is_a_clear_error(tmp_path):
    path = tmp_path / "layer.onnx"
    recurrent_model(path, "RNN", activations=["Swish"])
    with pytest.raises(Exception, match="unknown activation 'Swish'"):
        kiln.compile(path, tmp_path / "layer.kiln")
        kiln.Runner(tmp_path / "layer.kiln")
