#!/usr/bin/env python3
"""int8 models: kiln against onnxruntime and OpenVINO on the same QDQ model.

    .venv/bin/python bench/int8_compare.py [--models resnet50,mobilenetv2] [--no-write]

For each bench model (bench/models/make_models.py), onnxruntime's own
quantizer makes the int8 model (quantize_static, QDQ format, per-channel i8
weights, u8 activations, calibrated on 16 random inputs). Then, one process
per engine, 2 threads, at batch 1 and 8 (the same inputs for every engine):

- p50 latency of kiln on the f32 model, and of kiln, onnxruntime and OpenVINO
  on the int8 model; the ratios kiln int8 / kiln f32 and against each peer;
- agreement with onnxruntime on the int8 model: the largest difference of an
  output in quantization steps of the model's last DequantizeLinear, and
  whether the argmax of every row agrees (kiln's and OpenVINO's).

Writes the table into bench/RESULTS.md under "## int8 QDQ models" (that
section is replaced)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "models"))

import compare  # noqa: E402
import make_models  # noqa: E402

SECTION = "## int8 QDQ models"
ITERATIONS = {1: 100, 8: 20}


def quantize(f32_path: str, out_path: str, calibration_batch: int = 16, samples=None) -> None:
    """onnxruntime's quantize_static, QDQ, per-channel i8 weights, u8
    activations; calibrated on `samples` (feeds), or on `calibration_batch`
    random inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if samples is None:
        inputs = compare.model_inputs(f32_path)
        rng = np.random.default_rng(compare.SEED)
        samples = []
        for _ in range(calibration_batch):
            feed = {}
            for name, dtype, dims, spec in inputs:
                feed[name] = compare.make_input(rng, dtype, compare.concrete_shape(dims, spec, 1), spec)
            samples.append(feed)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter(samples)

        def get_next(self):
            return next(self.data, None)

    prepared = out_path + ".pre.onnx"
    quant_pre_process(f32_path, prepared, skip_symbolic_shape=True)
    quantize_static(prepared, out_path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    os.remove(prepared)


def output_step(model_path: str):
    """The scale of the DequantizeLinear that makes the first output, if one does."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(model_path)
    name = model.graph.output[0].name
    node = next((n for n in model.graph.node if name in n.output), None)
    if node is None or node.op_type != "DequantizeLinear":
        return None
    scale = next(i for i in model.graph.initializer if i.name == node.input[1])
    return float(numpy_helper.to_array(scale))


def agreement(reference_dir, candidate_dir, name, step):
    ref = np.load(os.path.join(reference_dir, compare.safe_name(name) + ".npy"))
    cand = np.load(os.path.join(candidate_dir, compare.safe_name(name) + ".npy"))
    diff = float(np.abs(cand.astype(np.float64) - ref).max())
    rows = ref.reshape(ref.shape[0], -1)
    same = int((cand.reshape(rows.shape).argmax(axis=1) == rows.argmax(axis=1)).sum())
    return (diff / step if step else diff), same, rows.shape[0]


def p50(result):
    return json.loads(result.stdout.strip().splitlines()[-1])["p50_ms"] if result.rc == 0 else None


def bench(name, args, log):
    work = os.path.join(args.work_dir, name)
    os.makedirs(work, exist_ok=True)
    f32 = os.path.join(args.models_dir, f"{name}.onnx")
    if not os.path.exists(f32):
        make_models.main([args.models_dir, "--models", name, "--quiet"])
    int8 = os.path.join(work, f"{name}_qdq.onnx")
    if not os.path.exists(int8):
        log(f"{name}: quantizing with onnxruntime")
        quantize(f32, int8)
    step = output_step(int8)
    names = compare.output_names(int8)
    rows = []
    for batch in (1, 8):
        inputs, dims = compare.write_inputs(f32, batch, os.path.join(work, f"inputs{batch}"))
        row = {"model": name, "batch": batch}
        for label, model in (("kiln_f32", f32), ("kiln_int8", int8)):
            package = os.path.join(work, f"{label}_b{batch}.kiln")
            info = compare.kiln_compile(args.kiln, model, package, inputs, args.timeout)
            if not info["ok"]:
                raise SystemExit(f"{name}: {label} at batch {batch}: {info['status']}")
            row[label] = p50(compare.kiln_bench(args.kiln, package, ITERATIONS[batch], 5, args.threads, args.timeout,
                                                inputs))
        saved = {}
        for engine in ("onnxruntime", "openvino"):
            saved[engine] = os.path.join(work, f"{engine}_out{batch}")
            row[engine] = p50(compare.run_worker(engine, int8, inputs, dims, ITERATIONS[batch], 5, args.threads,
                                                 saved[engine], args.timeout))
        # kiln's outputs on the same inputs, through the Python runner.
        import kiln
        feeds = {n: np.load(p) for n, p, _ in inputs}
        ours = kiln.Runner(os.path.join(work, f"kiln_int8_b{batch}.kiln")).run(feeds)
        saved["kiln"] = os.path.join(work, f"kiln_out{batch}")
        os.makedirs(saved["kiln"], exist_ok=True)
        for n, v in ours.items():
            np.save(os.path.join(saved["kiln"], compare.safe_name(n) + ".npy"), v)
        for engine in ("kiln", "openvino"):
            row[f"{engine}_steps"], row[f"{engine}_agree"], row["rows"] = agreement(
                saved["onnxruntime"], saved[engine], names[0], step)
        log(json.dumps(row))
        rows.append(row)
    return rows


def render(rows, command):
    def r(a, b):
        return f"{a / b:.2f}x" if a and b else "n/a"
    lines = [SECTION, "",
             f"`{command}` on {datetime.date.today().isoformat()}, {compare.machine_info()}, {args_threads} threads.",
             "Latencies are p50 ms; speed-ups are the peer's time over kiln int8's (above 1: kiln faster).",
             "Steps: the largest output difference from onnxruntime's, in quantization steps of the output;",
             "argmax: rows whose argmax equals onnxruntime's. The bench models have random weights, so their",
             "logits are nearly tied: a row where kiln and OpenVINO both differ from onnxruntime is such a tie.",
             "Where the time goes and what is left: docs/performance.md.", "",
             "| model | batch | kiln f32 | kiln int8 | onnxruntime int8 | OpenVINO int8 | int8 / f32 | vs onnxruntime "
             "| vs OpenVINO | kiln steps, argmax | OpenVINO steps, argmax |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['batch']} | {row['kiln_f32']:.3f} | {row['kiln_int8']:.3f} | "
            f"{row['onnxruntime']:.3f} | {row['openvino']:.3f} | {r(row['kiln_f32'], row['kiln_int8'])} | "
            f"{r(row['onnxruntime'], row['kiln_int8'])} | {r(row['openvino'], row['kiln_int8'])} | "
            f"{row['kiln_steps']:.0f}, {row['kiln_agree']}/{row['rows']} | "
            f"{row['openvino_steps']:.0f}, {row['openvino_agree']}/{row['rows']} |")
    return "\n".join(lines) + "\n"


args_threads = 2


def main(argv=None) -> int:
    global args_threads
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,mobilenetv2,minilm")
    parser.add_argument("--models-dir", default=os.path.join(ROOT, "build/bench/models"))
    parser.add_argument("--work-dir", default=os.path.join(ROOT, "build/bench/int8"))
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build/release/tools/kiln"))
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    args_threads = args.threads
    rows = []
    for name in args.models.split(","):
        rows += bench(name, args, lambda text: print(text, file=sys.stderr, flush=True))
    command = "python bench/int8_compare.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    table = render(rows, command.strip())
    compare.publish(table, args.results, SECTION, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
