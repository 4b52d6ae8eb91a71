"""Run-time shapes: one package for every batch size and sequence length.

    PYTHONPATH=build/release/python .venv/bin/python examples/dynamic_shapes_demo.py

Compiles a small attention block whose batch and sequence dimensions are
symbolic (`dynamic=True`), warms it up with the buckets a server would use,
largest first (so that no request pays for a compile or an arena growth),
then serves requests of varied sizes by padding each to its bucket, and
prints the plan cache and arena statistics against onnxruntime's outputs.
"""

import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

import kiln

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "tests"))
from test_dynamic_shapes import HIDDEN, attention_block  # noqa: E402  (the model the tests use)

BUCKETS = [16, 64, 128]  # sequence lengths; requests are padded up to one


def main() -> None:
    work = tempfile.mkdtemp(prefix="kiln-dynamic-")
    model = attention_block(os.path.join(work, "attention.onnx"))
    kiln.compile(model, os.path.join(work, "attention.kiln"), dynamic=True)
    runner = kiln.Runner(os.path.join(work, "attention.kiln"))
    print(f"inputs {runner.inputs}: -1 is a dimension fixed per call")

    started = time.perf_counter()
    for batch in (8, 1):
        for seq in reversed(BUCKETS):
            runner.run({"x": np.zeros((batch, seq, HIDDEN), np.float32)})
    print(f"warm-up: {len(BUCKETS) * 2} signatures compiled in {time.perf_counter() - started:.2f} s, "
          f"arena {runner.memory_stats()['arena_bytes'] / 1e6:.1f} MB")

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    worst = 0.0
    for length in rng.integers(1, BUCKETS[-1], size=40):
        batch = int(rng.choice([1, 8]))
        bucket = next(b for b in BUCKETS if b >= length)
        x = np.zeros((batch, bucket, HIDDEN), np.float32)
        x[:, :length] = rng.standard_normal((batch, length, HIDDEN))
        ours = runner.run({"x": x})["y"]
        worst = max(worst, float(np.abs(ours - session.run(None, {"x": x})[0]).max()))
    stats = runner.memory_stats()
    print(f"40 requests: plan cache hits {stats['plan_cache_hits']}, misses {stats['plan_cache_misses']} "
          f"(all during warm-up), {stats['cached_plans']} plans cached, arena {stats['arena_bytes'] / 1e6:.1f} MB; "
          f"max |kiln - onnxruntime| = {worst:.2e}")
    runner.shrink()
    print(f"after shrink(): arena {runner.memory_stats()['arena_bytes']} bytes")


if __name__ == "__main__":
    main()
