#!/usr/bin/env python3
"""Text detectors on a rendered page: kiln against onnxruntime, and how far
onnxruntime and kiln each move when the page moves by one ulp.

    PYTHONPATH=build/release/python .venv/bin/python bench/zoo/page_sensitivity.py \
        ppocr6_small_det ppocr4_det /path/to/det.onnx

Arguments are zoo model ids (from the cache) or .onnx paths; every model takes
one [1, 3, 640, 640] input named "x" (PaddleOCR's DBNet detectors). For each it
prints the max relative error max|kiln - ort| / max|ort| on the page and on
three copies with 1 ulp of random noise per pixel, and each engine's own
change under that noise: an error the size of that change is the model's
conditioning on the input, not an approximation (docs/performance.md,
"Numerics").
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageDraw, ImageFont

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
KILN = os.path.join(HERE, "..", "..", "build", "release", "tools", "kiln")
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
LINES = ["Invoice 2026-11-24", "total 1,284.50 EUR", "kiln compiles models ahead of time",
         "Quantity  Price  Amount", "Widget A   3   12.00   36.00", "Thank you for your business!"]


def page() -> np.ndarray:
    """18 lines of text on a white 640x640 page, normalised as PaddleOCR does (ImageNet mean and std)."""
    font = ImageFont.truetype(FONT, 22)
    image = Image.new("RGB", (640, 640), "white")
    draw = ImageDraw.Draw(image)
    for k, text in enumerate(LINES * 3):
        draw.text((20 + 7 * (k % 5), 20 + 34 * k), text, fill="black", font=font)
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    return np.ascontiguousarray(((pixels - mean) / std).transpose(2, 0, 1)[None])


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def main() -> int:
    cache = os.environ.get("KILN_ZOO_CACHE", os.path.expanduser("~/.cache/kiln/zoo"))
    x = page()
    rng = np.random.default_rng(0)
    inputs = [x] + [(x * (1 + 6e-8 * rng.standard_normal(x.shape))).astype(np.float32) for _ in range(3)]
    for arg in sys.argv[1:]:
        path = arg if arg.endswith(".onnx") else os.path.join(cache, "models", arg + ".onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        refs = [session.run(None, {"x": v})[0] for v in inputs]
        with tempfile.TemporaryDirectory() as tmp:
            package = os.path.join(tmp, "model.kiln")
            subprocess.run([KILN, "compile", path, "-o", package, "--shape", "x:1x3x640x640"], check=True,
                           capture_output=True)
            runner = kiln.Runner(package, threads=2)
            outs = [next(iter(runner.run({"x": v}).values())) for v in inputs]
        print(f"{os.path.basename(path)}:")
        print(f"  kiln vs onnxruntime: page {rel(outs[0], refs[0]):.2e}; 1-ulp copies "
              + " ".join(f"{rel(o, r):.2e}" for o, r in zip(outs[1:], refs[1:])))
        print("  own change under 1-ulp noise: onnxruntime " + " ".join(f"{rel(r, refs[0]):.2e}" for r in refs[1:])
              + "; kiln " + " ".join(f"{rel(o, outs[0]):.2e}" for o in outs[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
