#!/usr/bin/env python3
"""Compares kiln's cuda device with onnxruntime's CUDA execution provider on
the same GPU, in the same run (the CUDA issue's benchmark).

    python3 bench/cuda_compare.py --kiln build/release/tools/kiln \\
        [--models-dir build/bench/models] [--models mlp,resnet50,...] \\
        [--zoo-dir ~/.cache/kiln/zoo/models] [--zoo ppocr4_det,...] \\
        [--batches 1,32] [--seconds 3] [--tf32 | --fp16 | --bf16 --no-ort] [--dynamic] [--kiln-flags '...'] \\
        [--out cuda_results.md]

For each model and batch: kiln compiles it with `--target cuda` at that
batch; both engines run the same random inputs (the seeds of
bench/compare.py and bench/zoo/zoo.py); kiln's outputs are compared with
onnxruntime CUDA's (max relative error = max|kiln - ort| / max|ort|, worst
output); each engine is then timed for --seconds after a warm-up, host
memory in and host memory out per call, as an application sees it: kiln
with `kiln bench --device cuda` (a ModelRunner: copies, the main program as
one CUDA graph, copies back), onnxruntime with InferenceSession.run on numpy
arrays (CUDAExecutionProvider; use_tf32 off unless --ort-tf32 1, so that
both compute in f32). Prints a Markdown table
with the ratio ort_ms / kiln_ms (above 1: kiln is faster) and the geometric
mean per batch, and writes it to --out.

Needs a GPU, onnxruntime-gpu and the onnx package; bench/models is built
with bench/models/make_models.py when missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "models"))
sys.path.insert(0, os.path.join(HERE, "zoo"))

import compare  # noqa: E402  (input making shared with the CPU comparison)

BENCH_MODELS = ["mlp", "resnet50", "mobilenetv2", "minilm", "yolov8n", "chain1000"]


def bench_inputs(path, batch):
    rng = np.random.default_rng(compare.SEED + batch)
    feeds = {}
    for name, dtype, dims, spec in compare.model_inputs(path):
        feeds[name] = compare.make_input(rng, dtype, compare.concrete_shape(dims, spec, batch), spec)
    return feeds


def zoo_inputs(entry, batch):
    import zoo  # bench/zoo/zoo.py
    return zoo.make_inputs(entry, batch)


def run(cmd, **kwargs):
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)


def kiln_case(kiln, model, feeds, work, seconds, tf32=False, fp16=False, dynamic=False, bf16=False, extra=()):
    package = os.path.join(work, "model.kiln")
    # Scalars need no --shape: their rank-0 shape is fixed already.
    shapes = [a for name, v in feeds.items() if v.ndim > 0 for a in ("--shape", f"{name}:{'x'.join(map(str, v.shape))}")]
    compiled = run([kiln, "compile", model, "-o", package, "--target", "cuda", *(["--dynamic"] if dynamic else shapes),
                    *(["--tf32"] if tf32 else []), *(["--fp16"] if fp16 else []), *(["--bf16"] if bf16 else []),
                    *extra])
    if compiled.returncode != 0:
        return {"error": compiled.stderr.strip().splitlines()[-1]}
    host = [line for line in compiled.stderr.splitlines() if "run on the host" in line]
    inputs = []
    for name, value in feeds.items():
        path = os.path.join(work, compare.safe_name(name) + ".npy")
        np.save(path, value)
        inputs += ["--input", f"{name}={path}"]
    out_dir = os.path.join(work, "out")
    ran = run([kiln, "run", package, *inputs, "--output-dir", out_dir])
    if ran.returncode != 0:
        return {"error": ran.stderr.strip().splitlines()[-1]}
    outputs = {}
    for line in ran.stdout.splitlines():  # "name: {...} -> path"
        name, _, rest = line.partition(": ")
        outputs[name] = np.load(rest.rsplit(" -> ", 1)[1])
    # Iterations for about `seconds`, from a short timing first.
    probe = json.loads(run([kiln, "bench", package, *inputs, "--iterations", "10", "--warmup", "5", "--json"]).stdout)
    iterations = max(10, int(seconds * 1000 / max(probe["mean_ms"], 1e-3)))
    timed = run([kiln, "bench", package, *inputs, "--iterations", str(iterations), "--warmup", "20", "--json"])
    if timed.returncode != 0:
        return {"error": timed.stderr.strip().splitlines()[-1]}
    stats = json.loads(timed.stdout)
    return {"p50_ms": stats["p50_ms"], "mean_ms": stats["mean_ms"], "outputs": outputs, "host_steps": host}


def float16_model(model, work):
    """The model converted to f16 as onnxruntime users do it
    (onnxconverter-common, inputs and outputs kept f32)."""
    import onnx
    from onnxconverter_common import float16
    converted = float16.convert_float_to_float16(onnx.load(model), keep_io_types=True)
    path = os.path.join(work, "model.fp16.onnx")
    onnx.save(converted, path)
    return path


def ort_case(model, feeds, seconds, tf32):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3  # no warning about shape ops placed on the CPU
    session = ort.InferenceSession(model, options, providers=[("CUDAExecutionProvider", {"use_tf32": str(tf32)})])
    if session.get_providers()[0] != "CUDAExecutionProvider":
        raise RuntimeError(f"onnxruntime did not take the CUDA provider: {session.get_providers()}")
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds)))
    for _ in range(20):
        session.run(None, feeds)
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 10:
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"p50_ms": times[len(times) // 2], "mean_ms": sum(times) / len(times), "outputs": outputs}


def cpu_outputs(model, feeds, ours):
    """Without onnxruntime-gpu: onnxruntime's CPU outputs as the reference
    where onnxruntime is installed, else kiln's own (an error of 0)."""
    try:
        import onnxruntime as ort
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    except ImportError:
        return ours.get("outputs", {})


def max_rel_err(ours, theirs):
    worst = 0.0
    for name, reference in theirs.items():
        if name not in ours:
            return float("inf")
        a = ours[name].astype(np.float64)
        b = reference.astype(np.float64)
        if a.shape != b.shape:
            return float("inf")
        scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-12)
        worst = max(worst, float(np.max(np.abs(a - b))) / scale if b.size else 0.0)
    return worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kiln", default=os.path.join(os.path.dirname(HERE), "build/release/tools/kiln"))
    parser.add_argument("--models-dir", default=os.path.join(os.path.dirname(HERE), "build/bench/models"))
    parser.add_argument("--models", default=",".join(BENCH_MODELS))
    parser.add_argument("--zoo-dir", default=os.path.expanduser("~/.cache/kiln/zoo/models"))
    parser.add_argument("--zoo", default="")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default="")
    parser.add_argument("--no-ort", action="store_true",
                        help="time kiln alone (no onnxruntime-gpu at hand); errors against onnxruntime's CPU outputs")
    parser.add_argument("--ort-tf32", type=int, default=0, choices=[0, 1],
                        help="onnxruntime's use_tf32 (default 0: f32 like kiln's default; 1 is its own default)")
    parser.add_argument("--fp16", action="store_true",
                        help="both engines in f16: kiln compile --fp16, onnxruntime on the model converted by "
                             "onnxconverter-common (keep_io_types); errors against onnxruntime's f32 outputs")
    parser.add_argument("--tf32", action="store_true",
                        help="both engines with TF32 tensor cores: kiln compile --tf32, onnxruntime use_tf32=1")
    parser.add_argument("--bf16", action="store_true",
                        help="kiln compile --bf16 (with --no-ort: onnxruntime's CUDA provider has no bf16 conversion "
                             "to compare with); errors against onnxruntime's f32 outputs")
    parser.add_argument("--kiln-flags", default="",
                        help="more flags for kiln compile, e.g. '--no-attention-fusion' (for comparisons)")
    parser.add_argument("--dynamic", action="store_true",
                        help="kiln with run-time shapes: kiln compile --dynamic (each signature specialized for the "
                             "GPU at its first call) instead of --shape at each batch")
    args = parser.parse_args(argv)
    if args.bf16 and not args.no_ort:
        parser.error("--bf16 times kiln alone: add --no-ort")

    cases = []
    models = [m for m in args.models.split(",") if m]
    missing = [m for m in models if not os.path.exists(os.path.join(args.models_dir, m + ".onnx"))]
    if missing:
        import make_models
        make_models.main([args.models_dir, "--models", ",".join(missing), "--quiet"])
    batches = [int(b) for b in args.batches.split(",")]
    for name in models:
        path = os.path.join(args.models_dir, name + ".onnx")
        for batch in batches:
            cases.append((name, batch, path, lambda p=path, b=batch: bench_inputs(p, b)))
    if args.zoo:
        with open(os.path.join(HERE, "zoo", "models.json")) as f:
            entries = {e["id"]: e for e in json.load(f)["models"]}
        for name in args.zoo.split(","):
            entry = entries[name]
            fixed = not any(d == "B" for spec in entry["inputs"].values() for d in spec["shape"])
            for batch in ([1] if fixed else batches):
                cases.append((name, batch, os.path.join(args.zoo_dir, name + ".onnx"),
                              lambda e=entry, b=batch: zoo_inputs(e, b)))

    rows, ratios = [], {}
    for name, batch, path, make in cases:
        feeds = make()
        with tempfile.TemporaryDirectory() as work:
            try:
                ours = kiln_case(args.kiln, path, feeds, work, args.seconds, args.tf32, args.fp16, args.dynamic,
                                 args.bf16, args.kiln_flags.split())
                theirs = {"outputs": cpu_outputs(path, feeds, ours), "mean_ms": float("nan")} if args.no_ort else \
                    ort_case(float16_model(path, work) if args.fp16 else path, feeds, args.seconds,
                             1 if args.tf32 else args.ort_tf32)
                if args.fp16 and not args.no_ort:  # errors against f32, not against onnxruntime's f16
                    theirs["outputs"] = ort_case(path, feeds, 0, args.ort_tf32)["outputs"]
            except Exception as error:  # a row that says what failed, and go on
                ours, theirs = {"error": str(error)}, {}
        if "error" in ours:
            dashes = "-" if args.no_ort else "- | - | - | -"
            rows.append(f"| {name} | {batch} | {dashes} | {ours['error']} |")
            print(rows[-1], flush=True)
            continue
        err = max_rel_err(ours["outputs"], theirs["outputs"])
        note = "; ".join(h.replace("notice: ", "") for h in ours["host_steps"])
        if args.no_ort:  # kiln alone: its time, and its error against onnxruntime's CPU outputs
            rows.append(f"| {name} | {batch} | {ours['mean_ms']:.3f} | {err:.1e} | {note} |")
            print(rows[-1], flush=True)
            continue
        ratio = theirs["mean_ms"] / ours["mean_ms"]
        ratios.setdefault(batch, []).append(ratio)
        rows.append(f"| {name} | {batch} | {ours['mean_ms']:.3f} | {theirs['mean_ms']:.3f} | {ratio:.2f}x | "
                    f"{err:.1e} | {note} |")
        print(rows[-1], flush=True)
    header = (["| model | batch | kiln ms | max rel err vs ort CPU | notes |", "| --- | --- | --- | --- | --- |"]
              if args.no_ort else
              ["| model | batch | kiln ms | ort CUDA ms | ort/kiln | max rel err | notes |",
               "| --- | --- | --- | --- | --- | --- | --- |"])
    lines = [*header, *rows, ""]
    for batch, values in sorted(ratios.items()):
        geomean = math.exp(sum(math.log(v) for v in values) / len(values))
        lines.append(f"geomean at batch {batch}: {geomean:.2f}x over {len(values)} models (above 1: kiln is faster)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
