"""Post-training quantization: an f32 ONNX model and calibration data in, a
QDQ-quantized ONNX model out, which `kiln compile` runs in int8
(docs/quantization.md).

    python -m kiln.quantize model.onnx --calibration DIR -o model_int8.onnx \\
        [--method minmax|percentile|entropy] [--exclude-op-types Add] [--exclude-nodes NAME,...]

    from kiln.quantize import quantize
    report = quantize("model.onnx", "DIR", "model_int8.onnx", method="entropy")

What is quantized: every Conv (2-D and 1-D, constant weights) and MatMul
(constant 2-D weights), and every Add of two computed values, unless
excluded by op type or node name. Weights: int8, symmetric, one scale per
output channel (a Conv's axis 0, a MatMul's columns). Activations: u8,
asymmetric, one scale and zero point per tensor, from their range over the
calibration data:

- minmax: the smallest and largest values seen;
- percentile: the 0.01th and 99.99th percentiles (`percentile` sets the
  upper one), which ignore rare outliers;
- entropy: the clipping threshold whose quantization of the histogram of
  |x| (255 levels for a value of one sign, 128 for one of both) loses the
  least information (the Kullback-Leibler divergence of TensorRT's
  calibrator), on either side of 0, but never inside the 99.9th
  percentile of |x| (the divergence alone clipped PP-OCR's hard-swish
  outputs to 6% of their range).

Values that reach a graph output with no quantized node between (a
classifier's logits) keep their whole range (minmax) whatever the method:
clipping them ties the top classes. Constant nodes count as weights
(exporters such as paddle2onnx write weights as Constant nodes).

Biases become int32 at scale x_scale * w_scale (what QLinearConv takes).
BatchNormalizations after Convs are folded into them first. A
Relu or Clip that alone reads a quantized node's output is calibrated
after, not before: its range then starts at 0, so the
QuantizeLinear's saturation does its work and kiln's QDQ fusion drops it.

Calibration data: a directory of .npy files (one sample each, for a model
with one input) or .npz files (one sample each, arrays named by input).
Every sample has the same shapes. The model runs through kiln itself.

The report: per quantized value, the relative error of the quantized model
against f32 on the calibration data (||q - f|| / ||f||), and the same for
the model's outputs."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

METHODS = ("minmax", "percentile", "entropy")
ACTIVATIONS_AFTER = ("Relu", "Clip")  # calibrated after a quantized Conv or MatMul


@dataclass
class LayerError:
    value: str          # the tensor, by name
    node: str           # the node that makes it
    relative_error: float


@dataclass
class QuantizationReport:
    method: str
    quantized_nodes: List[str] = field(default_factory=list)
    layers: List[LayerError] = field(default_factory=list)
    outputs: Dict[str, float] = field(default_factory=dict)  # output name -> relative error

    def table(self) -> str:
        lines = [f"quantized {len(self.quantized_nodes)} nodes ({self.method} calibration)",
                 f"{'value':<60} {'node':<40} rel. error"]
        for layer in self.layers:
            lines.append(f"{layer.value[:60]:<60} {layer.node[:40]:<40} {layer.relative_error:.3e}")
        for name, error in self.outputs.items():
            lines.append(f"{'output ' + name:<60} {'':<40} {error:.3e}")
        return "\n".join(lines)


# ------------------------------------------------------------------ data


def load_calibration(directory: str, input_names: Sequence[str]) -> List[Dict[str, np.ndarray]]:
    """The samples of `directory`, each a feed dict; ValueError when none or malformed."""
    files = sorted(f for f in os.listdir(directory) if f.endswith((".npy", ".npz")))
    if not files:
        raise ValueError(f"no .npy or .npz files in {directory}")
    samples = []
    for name in files:
        path = os.path.join(directory, name)
        if name.endswith(".npy"):
            if len(input_names) != 1:
                raise ValueError(f"{path}: a .npy sample serves a model with one input; this one has "
                                 f"{len(input_names)} ({', '.join(input_names)}): use .npz files")
            samples.append({input_names[0]: np.load(path, allow_pickle=False)})
        else:
            with np.load(path, allow_pickle=False) as archive:
                missing = [n for n in input_names if n not in archive.files]
                if missing:
                    raise ValueError(f"{path}: no array for input(s) {', '.join(missing)}")
                samples.append({n: archive[n] for n in input_names})
    shapes = {n: samples[0][n].shape for n in input_names}
    for sample, name in zip(samples, files):
        for n in input_names:
            if sample[n].shape != shapes[n]:
                raise ValueError(f"{name}: input {n} is {list(sample[n].shape)}, the first sample's "
                                 f"{list(shapes[n])}: every sample must have the same shapes")
    return samples


# ----------------------------------------------------------- calibration


def _range_minmax(values: np.ndarray):
    return float(values.min()), float(values.max())


class _Histogram:
    """A value's range and a histogram of its absolute values, over samples."""

    BINS = 2048

    def __init__(self):
        self.low = np.inf
        self.high = -np.inf
        self.counts: Optional[np.ndarray] = None
        self.edge = 0.0  # the histogram covers |x| in [0, edge]
        self.values: List[np.ndarray] = []  # kept for percentiles (a subsample)

    def add(self, x: np.ndarray):
        x = x.astype(np.float32, copy=False).ravel()
        self.low = min(self.low, float(x.min()))
        self.high = max(self.high, float(x.max()))
        self.values.append(x if x.size <= 100_000 else x[:: max(1, x.size // 100_000)])
        # Exact zeros (half of a ReLU's output) quantize exactly whatever the
        # threshold; left in, their spike in the first bin would dominate
        # the divergence and pull the threshold down to the smallest tried.
        magnitude = np.abs(x[x != 0])
        if magnitude.size == 0:
            return
        top = float(magnitude.max())
        if self.counts is None:
            self.edge = top if top > 0 else 1.0
            self.counts = np.histogram(magnitude, bins=self.BINS, range=(0, self.edge))[0].astype(np.float64)
            return
        if top > self.edge:  # widen: rebin the old counts into the wider range
            old_edges = np.linspace(0, self.edge, self.BINS + 1)[:-1]
            self.edge = top
            self.counts = np.histogram(old_edges, bins=self.BINS, range=(0, self.edge), weights=self.counts)[0]
        self.counts += np.histogram(magnitude, bins=self.BINS, range=(0, self.edge))[0]


def _entropy_threshold(counts: np.ndarray, edge: float, levels: int = 128) -> float:
    """TensorRT's calibration: the threshold (a bin edge) whose clipped and
    `levels`-level quantized histogram is closest in KL divergence."""
    bins = counts.size
    total = counts.sum()
    if total == 0:
        return edge
    best, best_divergence = bins, np.inf
    for i in range(levels, bins + 1, 16):
        reference = counts[:i].astype(np.float64).copy()
        reference[i - 1] += counts[i:].sum()  # clipped outliers land in the last bin
        # Quantize the first i bins to `levels` levels, spreading each level
        # over the bins of it that were non-zero.
        chunks = np.array_split(counts[:i], levels)
        quantized = np.concatenate([
            np.where(chunk > 0, chunk.sum() / max(np.count_nonzero(chunk), 1), 0.0) for chunk in chunks])
        p = reference / reference.sum()
        q = quantized / max(quantized.sum(), 1e-30)
        mask = p > 0
        divergence = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if divergence < best_divergence:
            best, best_divergence = i, divergence
    return edge * best / bins


ENTROPY_FLOOR = 99.9  # percentile of |x| below which the entropy threshold never goes


def activation_range(histogram: _Histogram, method: str, percentile: float):
    """(low, high) of a value for its u8 quantization, 0 always inside."""
    if method == "minmax":
        low, high = histogram.low, histogram.high
    elif method == "percentile":
        values = np.concatenate(histogram.values)
        low = float(np.percentile(values, 100.0 - percentile)) if histogram.low < 0 else histogram.low
        high = float(np.percentile(values, percentile)) if histogram.high > 0 else histogram.high
    elif histogram.counts is None:  # entropy, of a value that was always 0
        low, high = 0.0, 0.0
    else:  # entropy: one threshold on |x|, applied to the sides the value has
        # u8 gives a value of one sign 255 steps, one of both signs about 128 a side.
        levels = 255 if histogram.low >= 0 else 128
        threshold = _entropy_threshold(histogram.counts, histogram.edge, levels)
        # Never inside the 99.9th percentile of |x|: the divergence alone cut
        # PP-OCR's hard-swish outputs to 6% of their range, and the
        # recognizer's top-1 agreement with f32 from 94% to 41%.
        threshold = max(threshold, float(np.percentile(np.abs(np.concatenate(histogram.values)), ENTROPY_FLOOR)))
        low = max(histogram.low, -threshold)
        high = min(histogram.high, threshold)
    return min(low, 0.0), max(high, 0.0)


def u8_parameters(low: float, high: float):
    scale = (high - low) / 255.0
    if not scale > 0 or not np.isfinite(scale):
        return np.float32(1.0), np.uint8(0)
    zero = int(np.clip(np.round(-low / scale), 0, 255))
    return np.float32(scale), np.uint8(zero)


# ------------------------------------------------------------- the model


def constants_to_initializers(model):
    """Each Constant node of the main graph (a tensor value) made an
    initializer, in place: exporters such as paddle2onnx give weights,
    biases and the 3 and 6 of a hard-swish as Constant nodes, which would
    otherwise be calibrated as activations (a scalar's one-value histogram
    clipped by the entropy method broke every hard-swish of PP-LCNet).
    Returns how many."""
    from onnx import helper, numpy_helper

    graph = model.graph
    outputs = {o.name for o in graph.output}
    moved = []
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.output[0] in outputs:
            continue
        attribute = node.attribute[0] if len(node.attribute) == 1 else None
        if attribute is None or attribute.name not in ("value", "value_float", "value_floats", "value_int",
                                                       "value_ints"):
            continue
        value = helper.get_attribute_value(attribute)
        if attribute.name == "value":
            array = numpy_helper.to_array(value)
        else:
            array = np.array(value, dtype=np.float32 if "float" in attribute.name else np.int64)
        graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
        moved.append(node)
    for node in moved:
        graph.node.remove(node)
    return len(moved)


def fold_batch_norms(model):
    """Each inference BatchNormalization that alone reads a Conv's output
    (constant weights) folded into the Conv's weights and bias, in place:
    quantizing the Conv's output before the normalization would keep kiln
    from folding it later (as onnxruntime's quant_pre_process does first).
    Returns how many."""
    from onnx import numpy_helper

    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    readers: Dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    producer = {out: node for node in graph.node for out in node.output}
    folded = []
    for bn in graph.node:
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1 or len(bn.input) != 5:
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or readers.get(conv.output[0]) != 1 or conv.output[0] in outputs:
            continue
        if conv.input[1] not in initializers or not all(name in initializers for name in bn.input[1:]):
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(initializers[n]).astype(np.float64) for n in bn.input[1:])
        epsilon = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        factor = gamma / np.sqrt(var + epsilon)
        w = numpy_helper.to_array(initializers[conv.input[1]]).astype(np.float64)
        b = (numpy_helper.to_array(initializers[conv.input[2]]).astype(np.float64)
             if len(conv.input) > 2 and conv.input[2] in initializers else np.zeros(w.shape[0]))
        w_name, b_name = f"{conv.output[0]}/folded_weight", f"{conv.output[0]}/folded_bias"
        graph.initializer.extend([
            numpy_helper.from_array((w * factor.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32), w_name),
            numpy_helper.from_array(((b - mean) * factor + beta).astype(np.float32), b_name)])
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]
        folded.append(bn)
    for bn in folded:
        graph.node.remove(bn)
    return len(folded)


def _plan(model, exclude_op_types, exclude_nodes):
    """The nodes to quantize and, per node, the values calibrated as its
    inputs and output (a Relu or Clip after it moves the output point)."""
    from onnx import numpy_helper  # noqa: F401  (onnx is needed from here on)

    initializers = {i.name: i for i in model.graph.initializer}
    readers: Dict[str, List] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    plan = []
    for index, node in enumerate(model.graph.node):
        if node.op_type in exclude_op_types or node.name in exclude_nodes:
            continue
        if node.op_type == "Conv" and len(node.input) >= 2 and node.input[1] in initializers \
                and len(initializers[node.input[1]].dims) in (3, 4) and node.input[0] not in initializers:
            inputs = [node.input[0]]
        elif node.op_type == "MatMul" and node.input[1] in initializers \
                and len(initializers[node.input[1]].dims) == 2 and node.input[0] not in initializers:
            inputs = [node.input[0]]
        elif node.op_type == "Add" and len(node.input) == 2 and not any(i in initializers for i in node.input):
            inputs = list(node.input)
        else:
            continue
        output = node.output[0]
        after = readers.get(output, [])
        if len(after) == 1 and after[0].op_type in ACTIVATIONS_AFTER and output not in graph_outputs:
            output = after[0].output[0]
        plan.append((index, inputs, output))
    return plan


def _head_values(model, plan, values):
    """The calibrated values from which a graph output is reached with no
    quantized node between (a classifier's logits, say): they keep their whole
    range whatever the method, since clipping them ties the top classes (an
    entropy-clipped two-class head agreed with f32 on 60% of the images)."""
    planned = {model.graph.node[i].name or str(i) for i, _, _ in plan}
    readers: Dict[str, List] = {}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            readers.setdefault(name, []).append((node.name or str(index), node))
    graph_outputs = {o.name for o in model.graph.output}
    heads = set()
    for value in values:
        frontier, seen = [value], {value}
        while frontier:
            current = frontier.pop()
            if current in graph_outputs:
                heads.add(value)
                break
            for key, node in readers.get(current, []):
                if key in planned:
                    continue
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        frontier.append(out)
    return heads


def _with_outputs(model, names):
    """A copy of `model` that also outputs `names` (f32 values; graph inputs
    are left out: _run takes them from the samples)."""
    import onnx
    from onnx import helper
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output} | {i.name for i in copy.graph.input}
    for name in names:
        if name not in present:
            copy.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            present.add(name)
    return copy


def _run(kiln, model, samples, work, tag):
    """Outputs of `model` (by kiln) on every sample: a list of dicts."""
    import onnx
    path = os.path.join(work, f"{tag}.onnx")
    onnx.save(model, path)
    shapes = {name: list(array.shape) for name, array in samples[0].items()}
    kiln.compile(path, os.path.join(work, f"{tag}.kiln"), shapes=shapes)
    runner = kiln.Runner(os.path.join(work, f"{tag}.kiln"))
    return [{**sample, **runner.run(sample)} for sample in samples]


def _quantize_weights(weights: np.ndarray, axis: int):
    """Symmetric int8 per channel along `axis`: (q, scales)."""
    moved = np.moveaxis(weights, axis, 0).reshape(weights.shape[axis], -1)
    scales = np.abs(moved).max(axis=1) / 127.0
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)
    shape = [1] * weights.ndim
    shape[axis] = -1
    q = np.clip(np.round(weights / scales.reshape(shape)), -127, 127).astype(np.int8)
    return q, scales


def dequantized_name(model, value: str) -> str:
    """What the QDQ model calls `value` dequantized: the name itself for a
    graph output (the model's outputs keep their names), else <value>/dequantized."""
    return value if value in {o.name for o in model.graph.output} else f"{value}/dequantized"


def _insert_qdq(model, plan, parameters):
    """The QDQ model: Q/DQ pairs on the planned values, weights and biases
    quantized in place of their float initializers. A graph output that is
    quantized is the DequantizeLinear's output (its float value is renamed
    <name>/f32), so that the last product is quantized too."""
    import onnx
    from onnx import helper, numpy_helper

    quantized = onnx.ModelProto()
    quantized.CopyFrom(model)
    graph = quantized.graph
    initializers = {i.name: i for i in graph.initializer}
    new_inits, new_nodes = [], {}

    def add_init(array, name):
        new_inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    # Q/DQ after each calibrated value: every reader reads the DQ's output.
    graph_outputs = {o.name for o in graph.output}
    activation_dq = {}
    float_name = {}  # a quantized graph output's float value, renamed
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name in parameters and name in graph_outputs:
                float_name[name] = node.output[i] = f"{name}/f32"
    for value, (scale, zero) in parameters.items():
        s = add_init(scale, f"{value}/scale")
        z = add_init(zero, f"{value}/zero_point")
        source = float_name.get(value, value)
        q_node = helper.make_node("QuantizeLinear", [source, s, z], [f"{value}/quantized"], name=f"{value}/QuantizeLinear")
        dq_node = helper.make_node("DequantizeLinear", [f"{value}/quantized", s, z], [dequantized_name(model, value)],
                                   name=f"{value}/DequantizeLinear")
        new_nodes[source] = [q_node, dq_node]
        activation_dq[value] = dq_node.output[0]
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in activation_dq and name not in graph_outputs:
                node.input[i] = activation_dq[name]
            elif name in float_name:
                node.input[i] = float_name[name]  # other readers of an output keep its float value
    # Weights (and biases) of the planned Convs and MatMuls.
    for index, inputs, _ in plan:
        node = graph.node[index]
        if node.op_type == "Add":
            continue
        prefix = node.name or f"{node.op_type}_{index}"  # names of what it adds; nodes may have none
        w_name = node.input[1]
        weights = numpy_helper.to_array(initializers[w_name]).astype(np.float32)
        axis = 0 if node.op_type == "Conv" else 1
        q, scales = _quantize_weights(weights, axis)
        qw = add_init(q, f"{prefix}/weight_quantized")
        sw = add_init(scales, f"{prefix}/weight_scale")
        zw = add_init(np.zeros(scales.shape, np.int8), f"{prefix}/weight_zero_point")
        dq_w = f"{prefix}/weight_dequantized"
        new_nodes.setdefault(("weights", index), []).append(
            helper.make_node("DequantizeLinear", [qw, sw, zw], [dq_w], axis=axis, name=dq_w + "_node"))
        node.input[1] = dq_w
        if node.op_type == "Conv" and len(node.input) > 2 and node.input[2] in initializers:
            x_scale = float(parameters[inputs[0]][0])
            bias = numpy_helper.to_array(initializers[node.input[2]]).astype(np.float64)
            bias_scale = (np.float32(x_scale) * scales).astype(np.float32)
            qb = np.clip(np.round(bias / bias_scale), -2**31 + 128, 2**31 - 128).astype(np.int32)
            b = add_init(qb, f"{prefix}/bias_quantized")
            bs = add_init(bias_scale, f"{prefix}/bias_scale")
            bz = add_init(np.zeros(qb.shape, np.int32), f"{prefix}/bias_zero_point")
            dq_b = f"{prefix}/bias_dequantized"
            new_nodes[("weights", index)].append(
                helper.make_node("DequantizeLinear", [b, bs, bz], [dq_b], axis=0, name=dq_b + "_node"))
            node.input[2] = dq_b
    # Rebuild the node list in order: each value's Q/DQ right after its producer
    # (graph inputs' first), weight DQs before their node.
    ordered = []
    for value in parameters:
        if not any(float_name.get(value, value) in n.output for n in graph.node):
            ordered += new_nodes[float_name.get(value, value)]
    for index, node in enumerate(graph.node):
        ordered += new_nodes.get(("weights", index), [])
        ordered.append(node)
        for out in node.output:
            ordered += new_nodes.get(out, [])
    del graph.node[:]
    graph.node.extend(ordered)
    graph.initializer.extend(new_inits)
    return quantized


def quantize(model_path, calibration_dir, output_path, method: str = "minmax", percentile: float = 99.99,
             exclude_op_types: Sequence[str] = (), exclude_nodes: Sequence[str] = (),
             report: bool = True) -> QuantizationReport:
    """Writes the QDQ-quantized model; returns the report (docs/quantization.md)."""
    import onnx

    import kiln

    if method not in METHODS:
        raise ValueError(f"method '{method}' is not one of {', '.join(METHODS)}")
    model = onnx.load(model_path)
    constants_to_initializers(model)
    fold_batch_norms(model)
    initializer_names = {i.name for i in model.graph.initializer}
    input_names = [i.name for i in model.graph.input if i.name not in initializer_names]
    samples = load_calibration(calibration_dir, input_names)
    plan = _plan(model, set(exclude_op_types), set(exclude_nodes))
    if not plan:
        raise ValueError("nothing to quantize: no Conv or MatMul with constant weights, nor Add of two values, "
                         "outside the exclusions")
    values = []
    for _, inputs, output in plan:
        for v in inputs + [output]:
            if v not in values:
                values.append(v)
    with tempfile.TemporaryDirectory() as work:
        f32_runs = _run(kiln, _with_outputs(model, values), samples, work, "f32")
        histograms = {v: _Histogram() for v in values}
        for run in f32_runs:
            for v in values:
                histograms[v].add(run[v])
        heads = _head_values(model, plan, values)
        parameters = {v: u8_parameters(*activation_range(histograms[v], "minmax" if v in heads else method,
                                                         percentile)) for v in values}
        quantized = _insert_qdq(model, plan, parameters)
        onnx.save(quantized, output_path)
        result = QuantizationReport(method=method, quantized_nodes=[model.graph.node[i].name for i, _, _ in plan])
        if not report:
            return result
        # The quantized model's values (the DQ outputs) against f32.
        dq_names = [dequantized_name(model, v) for v in values]
        q_runs = _run(kiln, _with_outputs(quantized, dq_names), samples, work, "int8")
        producer = {out: node.name for node in model.graph.node for out in node.output}

        def relative(a_runs, b_runs, a_name, b_name):
            num = sum(float(np.sum((b[b_name].astype(np.float64) - a[a_name]) ** 2)) for a, b in zip(a_runs, b_runs))
            den = sum(float(np.sum(a[a_name].astype(np.float64) ** 2)) for a in a_runs)
            return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))

        for v in values:
            result.layers.append(LayerError(v, producer.get(v, "(input)"),
                                            relative(f32_runs, q_runs, v, dequantized_name(model, v))))
        for out in model.graph.output:
            result.outputs[out.name] = relative(f32_runs, q_runs, out.name, out.name)
    return result


def kiln_error():
    import kiln
    return kiln.Error


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.quantize",
                                     description="Quantize an f32 ONNX model to a QDQ int8 model from calibration data")
    parser.add_argument("model")
    parser.add_argument("--calibration", required=True, help="a directory of .npy (one input) or .npz samples")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--method", choices=METHODS, default="minmax")
    parser.add_argument("--percentile", type=float, default=99.99, help="the upper percentile (percentile method)")
    parser.add_argument("--exclude-op-types", default="", help="comma-separated op types left in f32")
    parser.add_argument("--exclude-nodes", default="", help="comma-separated node names left in f32")
    args = parser.parse_args(argv)
    split = lambda text: [t for t in text.split(",") if t]  # noqa: E731
    try:
        result = quantize(args.model, args.calibration, args.output, args.method, args.percentile,
                          split(args.exclude_op_types), split(args.exclude_nodes))
    except (ValueError, OSError, kiln_error()) as e:
        print(f"kiln.quantize: error: {e}", file=sys.stderr)
        return 1
    print(result.table())
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
