"""The kiln demo: compile ResNet-50 from ONNX, run it, and compare with
onnxruntime on the same input.

    make demo            (runs this after the package-format demo)

The model is the ResNet-50 v1.5 topology that bench/models/make_models.py
builds with seeded random weights (no download is possible here), so its
"top classes" are those of an untrained network: the point is that kiln and
onnxruntime agree, and how fast each is.
"""

import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "demo")
ONNX_PATH = os.path.join(WORK, "models", "resnet50.onnx")
KILN_PATH = os.path.join(WORK, "resnet50.kiln")
RUNS = 20


def p50_ms(run):
    run()  # warm-up
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def mib(n):
    return n / 2**20


def main():
    if not os.path.exists(ONNX_PATH):
        print("building the ResNet-50 model (bench/models/make_models.py) ...")
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "models", "make_models.py"),
                        os.path.dirname(ONNX_PATH), "--models", "resnet50"], check=True)

    start = time.perf_counter()
    report = kiln.compile(ONNX_PATH, KILN_PATH, batch=1)
    print(f"compiled {os.path.relpath(ONNX_PATH, ROOT)} -> {os.path.relpath(KILN_PATH, ROOT)} in "
          f"{time.perf_counter() - start:.2f} s: {report['steps']} steps, {report['constants']} weight tensors "
          f"({mib(report['constant_bytes']):.1f} MiB)")
    print(f"memory plan: {report['plan']}")

    runner = kiln.Runner(KILN_PATH)
    (name, shape, _), = runner.inputs
    image = np.random.default_rng(2026).standard_normal(shape).astype(np.float32)
    logits = next(iter(runner.run({name: image}).values()))[0]
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    top = np.argsort(probabilities)[::-1][:5]
    print("top 5 classes:", ", ".join(f"{c} ({probabilities[c]:.3f})" for c in top))

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(ONNX_PATH, options, providers=["CPUExecutionProvider"])
    reference = session.run(None, {name: image})[0][0]
    print(f"agreement with onnxruntime: max abs diff {np.abs(reference - logits).max():.2e}, "
          f"same top-5: {list(np.argsort(reference)[::-1][:5]) == list(top)}")

    kiln_ms = p50_ms(lambda: runner.run({name: image}))
    ort_ms = p50_ms(lambda: session.run(None, {name: image}))
    print(f"latency (batch 1, median of {RUNS}): kiln {kiln_ms:.1f} ms, onnxruntime {ort_ms:.1f} ms "
          f"(kiln / onnxruntime = {kiln_ms / ort_ms:.2f})")


if __name__ == "__main__":
    main()
