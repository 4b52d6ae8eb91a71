#!/usr/bin/env python3
"""Reads text that it renders on the spot, with a real public OCR model.

    PYTHONPATH=build/release/python .venv/bin/python examples/ocr_demo.py ["Your own line of text"]

The model is PP-OCRv4's text recognizer as the rapidocr-onnxruntime wheel ships
it (bench/zoo fetches the wheel from the Python registry once and caches the
model). The demo draws each line of text into an image with the DejaVu Sans
font, compiles the model with kiln for that image size, reads the line back
(greedy CTC decoding over the character list stored in the model), and times
the same call on kiln, onnxruntime and OpenVINO, 2 threads each.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
from PIL import Image, ImageDraw, ImageFont

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "zoo"))
sys.path.insert(0, os.path.join(ROOT, "build", "release", "python"))

import kiln  # noqa: E402
import zoo  # noqa: E402

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
HEIGHT = 48  # the recognizer reads 48-pixel-high lines; the width follows the text
THREADS = 2
LINES = ["kiln compiles models ahead of time", "Invoice 2026-11-24: total 1,284.50 EUR"]


def render(text: str) -> np.ndarray:
    """The line as the recognizer wants it: [1, 3, 48, width], scaled to
    [-1, 1], the width a multiple of 32 with a margin around the text."""
    font = ImageFont.truetype(FONT, 28)
    width = -(-(int(font.getlength(text)) + 24) // 32) * 32
    image = Image.new("RGB", (width, HEIGHT), "white")
    ImageDraw.Draw(image).text((12, 7), text, fill="black", font=font)
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    return np.ascontiguousarray(((pixels - 0.5) / 0.5).transpose(2, 0, 1)[None])


def decode(probabilities: np.ndarray, characters: list[str]) -> str:
    """Greedy CTC: the best class per column, repeats merged, blanks (0) dropped."""
    best = probabilities[0].argmax(axis=-1)
    text, previous = [], -1
    for index in best:
        if index != previous and index != 0:
            text.append(characters[index])
        previous = index
    return "".join(text).strip()


def p50_ms(infer, runs=30) -> float:
    infer()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        infer()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    lines = sys.argv[1:] or LINES
    entry = next(e for e in zoo.load_manifest() if e["id"] == "ppocr4_rec_w320")
    if zoo.fetch([entry], print):
        print("cannot fetch the OCR model (it comes from the Python registry)")
        return 1
    path = zoo.model_path(entry)
    metadata = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    characters = ["blank"] + metadata["character"].splitlines() + [" "]

    print(f"PP-OCRv4 text recognizer from {entry['package']} {entry['version']}")

    import onnxruntime as ort
    import openvino as ov
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    core = ov.Core()

    for text in lines:
        image = render(text)
        # One package per image size: compiling takes a fraction of a second.
        package = os.path.join(tempfile.mkdtemp(), "ocr.kiln")
        report = kiln.compile(path, package, shapes={"x": list(image.shape)})
        runner = kiln.Runner(package, threads=THREADS)
        model = core.read_model(path)
        model.reshape({"x": ov.PartialShape(list(image.shape))})
        compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": THREADS,
                                                     "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()
        print(f"\n  image {image.shape[3]}x{image.shape[2]}: kiln compiled {report['steps']} steps, arena "
              f"{report['arena_bytes'] / 2**20:.1f} MiB")
        probabilities = runner.run({"x": image})[runner.outputs[0][0]]
        reference = session.run(None, {"x": image})[0]
        read = decode(probabilities, characters)
        print(f"  drawn: {text!r}\n  read:  {read!r}  ({'exact' if read == text else 'differs'}; "
              f"same as onnxruntime: {read == decode(reference, characters)})")
        timings = {"kiln": p50_ms(lambda: runner.run({"x": image})),
                   "onnxruntime": p50_ms(lambda: session.run(None, {"x": image})),
                   "OpenVINO": p50_ms(lambda: request.infer({"x": image}))}
        print("  p50 latency, {} threads: ".format(THREADS)
              + ", ".join(f"{name} {ms:.2f} ms" for name, ms in timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
