#!/usr/bin/env python3
"""kiln's calibration (kiln.quantize) against onnxruntime's quantizer: how
often the int8 model's top-1 class is the f32 model's.

    .venv/bin/python bench/quantize_agreement.py [--models resnet50,mobilenetv2] [--held-out 100] [--no-write]

For each bench model: 16 calibration inputs (seeded), quantized by
kiln.quantize with each method and by onnxruntime's quantize_static (QDQ,
per-channel, u8 activations, its min-max calibration) from the same inputs;
every model then runs in kiln on `--held-out` other inputs, and the table
gives the share whose int8 top-1 equals the f32 top-1, the share whose f32
top-1 is among the int8 top-5, and the output's relative error. The bench
models have random weights and the inputs are noise, so their logits are
close together: the top-1 agreement of both quantizers is lower than on
trained models and real data. Writes the table into bench/RESULTS.md under
"## Calibration agreement"."""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "models"))

import compare  # noqa: E402
import int8_compare  # noqa: E402
import make_models  # noqa: E402

SECTION = "## Calibration agreement"


def agreement(kiln, f32_package, int8_package, inputs):
    f32, int8 = kiln.Runner(f32_package), kiln.Runner(int8_package)
    top1 = top5 = 0
    errors = []
    for feed in inputs:
        a = next(iter(f32.run(feed).values())).ravel()
        b = next(iter(int8.run(feed).values())).ravel()
        top1 += int(a.argmax() == b.argmax())
        top5 += int(a.argmax() in np.argsort(b)[-5:])
        errors.append(np.abs(a - b).max() / np.abs(a).max())
    return top1 / len(inputs), top5 / len(inputs), float(np.median(errors))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,mobilenetv2")
    parser.add_argument("--models-dir", default=os.path.join(ROOT, "build/bench/models"))
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    import kiln
    from kiln.quantize import quantize

    rows = []
    for name in args.models.split(","):
        f32 = os.path.join(args.models_dir, f"{name}.onnx")
        if not os.path.exists(f32):
            make_models.main([args.models_dir, "--models", name, "--quiet"])
        (input_name, dtype, dims, spec), = compare.model_inputs(f32)
        shape = compare.concrete_shape(dims, spec, 1)
        with tempfile.TemporaryDirectory() as work:
            calibration = os.path.join(work, "calibration")
            os.makedirs(calibration)
            rng = np.random.default_rng(compare.SEED)
            for i in range(16):
                np.save(os.path.join(calibration, f"{i:02d}.npy"), compare.make_input(rng, dtype, shape, spec))
            held_out = [{input_name: compare.make_input(rng, dtype, shape, spec)} for _ in range(args.held_out)]
            kiln.compile(f32, os.path.join(work, "f32.kiln"), batch=1)
            quantized = {}
            for method in ("minmax", "percentile", "entropy"):
                quantized[f"kiln.quantize {method}"] = os.path.join(work, f"{method}.onnx")
                quantize(f32, calibration, quantized[f"kiln.quantize {method}"], method=method, report=False)
            quantized["onnxruntime quantize_static"] = os.path.join(work, "ort.onnx")
            int8_compare.quantize(f32, quantized["onnxruntime quantize_static"], calibration_batch=16)
            for label, path in quantized.items():
                package = os.path.join(work, "int8.kiln")
                kiln.compile(path, package, batch=1)
                top1, top5, error = agreement(kiln, os.path.join(work, "f32.kiln"), package, held_out)
                rows.append((name, label, top1, top5, error))
                print(f"{name} {label}: top-1 {top1:.2f}, in top-5 {top5:.2f}, error {error:.3g}", file=sys.stderr)
    command = "python bench/quantize_agreement.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    lines = [SECTION, "",
             f"`{command.strip()}` on {datetime.date.today().isoformat()}, {compare.machine_info()}.",
             f"{args.held_out} held-out inputs per model; top-1: the int8 top-1 is the f32 one; in top-5: the f32",
             "top-1 is among the int8 top 5; error: median over the inputs of max|int8 - f32| / max|f32|. Random-weight",
             "models on noise inputs have close logits, so agreement is lower than on trained models.", "",
             "| model | quantizer | top-1 | in top-5 | error |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {q} | {t1:.2f} | {t5:.2f} | {e:.3g} |" for m, q, t1, t5, e in rows]
    table = "\n".join(lines) + "\n"
    compare.publish(table, args.results, SECTION, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
