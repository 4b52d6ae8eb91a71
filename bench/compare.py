#!/usr/bin/env python3
"""Compares kiln with onnxruntime and OpenVINO on the benchmark models.

    .venv/bin/python bench/compare.py [--models mlp,resnet50] [--quick] [--no-write]

For each model (built by bench/models/make_models.py into --models-dir; missing
ones are built first), in one run:

- kiln compiles it at batch 1 and batch 8 (`kiln compile --shape ...
  --plan-report`); a model kiln cannot compile is listed with status
  "unsupported: <ops>" taken from kiln's message;
- every engine runs the same random inputs (fixed seed) at batch 1; kiln's and
  OpenVINO's outputs are compared with onnxruntime's (max abs error, and max
  relative error = max|engine - ort| / max|ort|, per output, worst output);
- latency p50/p90 at batch 1 and throughput at batch 8 (8 * 1000 / mean ms of
  a batch-8 run) with 2 threads: kiln via `kiln bench --json`, onnxruntime
  (intra_op_num_threads=2) and OpenVINO (CPU, INFERENCE_NUM_THREADS=2, f32
  precision, LATENCY hint) each in a subprocess of its own (this script run
  with --worker);
- peak resident memory of the batch-1 latency process, from the wait4() rusage
  of that one process (ru_maxrss), measured the same way for every engine (see
  LAUNCHER for why through a small launcher).

Prints a Markdown table and writes it, with the command line, date and
machine, into bench/RESULTS.md under "## Model comparison" (that section is
replaced; the rest of the file is kept).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "models"))

import make_models  # noqa: E402

ENGINES = ("kiln", "onnxruntime", "openvino")
SEED = 1234
REL_TOLERANCE = 1e-4  # the acceptance bound for fp32 outputs

# (latency iterations at batch 1, throughput iterations at batch 8), full runs.
ITERATIONS = {
    "mlp": (1000, 200),
    "resnet50": (50, 10),
    "mobilenetv2": (200, 40),
    "minilm": (100, 20),
    "yolov8n": (30, 8),
    "chain1000": (2000, 500),
}


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

def safe_name(name: str) -> str:
    """kiln run's file name for a tensor: '/', ':' and spaces become '_'."""
    return re.sub(r"[/: ]", "_", name)


def percentile(sorted_values, p):
    return sorted_values[int(p * (len(sorted_values) - 1))]


def summarize(times_ms, batch):
    times = sorted(times_ms)
    mean = sum(times) / len(times)
    return {"iterations": len(times), "p50_ms": percentile(times, 0.5), "p90_ms": percentile(times, 0.9),
            "mean_ms": mean, "throughput_per_s": batch * 1000.0 / mean}


def rss_now_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Result:
    def __init__(self, rc, stdout, stderr, peak_rss_mib, wall_s, timed_out):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.peak_rss_mib, self.wall_s, self.timed_out = peak_rss_mib, wall_s, timed_out

    def last_json(self):
        for line in reversed(self.stdout.strip().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    pass
        return None

    def error_text(self, limit=300):
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        msg = text[-1] if text else f"exit status {self.rc}"
        if self.timed_out:
            msg = "timed out"
        return msg[:limit]


# Linux keeps a process's peak RSS across execve(), and a child made by fork()
# or vfork() starts from its parent's resident set: a command spawned straight
# from this (large) Python process would report at least this process's RSS
# as its own peak. So every measured command is started by this small launcher
# (a fresh `python -S`, a few MiB), which forks, execs the command, and writes
# the wait4() ru_maxrss of that one grandchild to a file.
LAUNCHER = r"""
import os, sys
out, cmd = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        os.write(2, ("cannot run %s: %s\n" % (cmd[0], e)).encode())
    os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as f:
    f.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def run_measured(cmd, timeout_s, env=None) -> Result:
    """Runs cmd; returns its output and the peak RSS of that command alone."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r", suffix=".maxrss") as rss:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, rss.name] + list(cmd), stdout=out,
                                stderr=err, env=env, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the launcher and the command: their own session
            proc.wait()
            timed_out = True
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        text = rss.read().strip()
        return Result(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                      int(text) / 1024.0 if text else None, wall, timed_out)


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

ONNX_TO_NUMPY = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 11: np.float64}


def model_inputs(path):
    """[(name, numpy dtype, dims (ints or symbol names), spec dict)] from the ONNX file."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    initializers = {t.name for t in model.graph.initializer}
    result = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        t = value.type.tensor_type
        dims = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        spec = json.loads(props.get(f"bench.input.{value.name}", '{"dist": "normal"}'))
        result.append((value.name, ONNX_TO_NUMPY[t.elem_type], dims, spec))
    return result


def concrete_shape(dims, spec, batch):
    shape = []
    for d in dims:
        if isinstance(d, int) and d > 0:
            shape.append(d)
        elif d == "batch":
            shape.append(batch)
        elif isinstance(d, str) and d in spec.get("dims", {}):
            shape.append(int(spec["dims"][d]))
        else:
            raise ValueError(f"no value for dimension {d!r}")
    return shape


def make_input(rng, dtype, shape, spec):
    dist = spec.get("dist", "normal")
    if dist == "normal":
        return rng.standard_normal(shape).astype(dtype)
    if dist == "uniform":
        return rng.uniform(spec.get("low", 0.0), spec.get("high", 1.0), shape).astype(dtype)
    if dist == "int":
        return rng.integers(spec["low"], spec["high"], shape).astype(dtype)
    if dist == "mask":  # 1s; even rows end with a quarter of padding (0s), as a padded batch would
        mask = np.ones(shape, dtype)
        mask[0::2, ..., shape[-1] - shape[-1] // 4:] = 0
        return mask
    raise ValueError(f"unknown input distribution {dist!r}")


def write_inputs(model_path, batch, directory):
    """Writes one .npy per input; returns [(name, file, shape)] and the symbolic dims' values."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(SEED + batch)
    files, dims = [], {}
    for name, dtype, sym_dims, spec in model_inputs(model_path):
        shape = concrete_shape(sym_dims, spec, batch)
        for d, v in zip(sym_dims, shape):
            if isinstance(d, str):
                dims[d] = v
        path = os.path.join(directory, safe_name(name) + ".npy")
        np.save(path, make_input(rng, dtype, shape, spec))
        files.append((name, path, shape))
    return files, dims


# ---------------------------------------------------------------------------
# Workers (run in a subprocess: this script with --worker ENGINE)
# ---------------------------------------------------------------------------

def worker_main(args) -> int:
    baseline_rss = None
    inputs = {}
    for item in args.input:
        name, _, path = item.partition("=")
        inputs[name] = np.load(path)
    batch = next(iter(inputs.values())).shape[0] if inputs else 1
    dims = dict(kv.split("=") for kv in args.dims.split(",") if kv)
    if args.worker == "onnxruntime":
        import onnxruntime as ort
        baseline_rss = rss_now_mib()
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        for d, v in dims.items():  # static shapes, like kiln's compile at a fixed batch
            so.add_free_dimension_override_by_name(d, int(v))
        sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
        output_names = [o.name for o in sess.get_outputs()]

        def infer():
            return sess.run(output_names, inputs)
    elif args.worker == "openvino":
        import openvino as ov
        baseline_rss = rss_now_mib()
        core = ov.Core()
        model = core.read_model(args.model)
        model.reshape({name: ov.PartialShape(list(a.shape)) for name, a in inputs.items()})
        config = {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": "f32",
                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        compiled = core.compile_model(model, "CPU", config)
        request = compiled.create_infer_request()
        ports = list(compiled.outputs)
        output_names = [p.get_any_name() for p in ports]
        feeds = {name: ov.Tensor(np.ascontiguousarray(a)) for name, a in inputs.items()}

        def infer():
            request.infer(feeds)
            return [request.get_tensor(p).data for p in ports]
    else:
        raise SystemExit(f"unknown worker {args.worker}")

    outputs = infer()
    if args.save_outputs:
        os.makedirs(args.save_outputs, exist_ok=True)
        for name, value in zip(output_names, outputs):
            np.save(os.path.join(args.save_outputs, safe_name(name) + ".npy"), np.array(value, copy=True))
    for _ in range(args.warmup):
        infer()
    times = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        infer()
        times.append((time.perf_counter() - start) * 1000.0)
    result = summarize(times, batch)
    result["baseline_rss_mib"] = baseline_rss
    print(json.dumps(result))
    return 0


def run_worker(engine, model_path, inputs, dims, iterations, warmup, threads, save_outputs, timeout_s):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--model-file", model_path,
           "--iterations", str(iterations), "--warmup", str(warmup), "--threads", str(threads),
           "--dims", ",".join(f"{k}={v}" for k, v in dims.items())]
    for name, path, _ in inputs:
        cmd += ["--input", f"{name}={path}"]
    if save_outputs:
        cmd += ["--save-outputs", save_outputs]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return run_measured(cmd, timeout_s, env)


# ---------------------------------------------------------------------------
# kiln
# ---------------------------------------------------------------------------

def unsupported_ops(message: str):
    """The op names in kiln's 'Unsupported: ...' message, or None when it is another error."""
    if "Unsupported" not in message:
        return None
    text = message[message.index("Unsupported"):]
    ops = re.findall(r"op '([^']+)'", text)
    if ops:
        return ", ".join(dict.fromkeys(ops))
    return text.split(":", 1)[1].strip()[:200] if ":" in text else text[:200]


def kiln_compile(kiln, model_path, out_path, inputs, timeout_s):
    cmd = [kiln, "compile", model_path, "-o", out_path, "--plan-report"]
    for name, _, shape in inputs:
        cmd += ["--shape", f"{name}:{'x'.join(str(d) for d in shape)}"]
    res = run_measured(cmd, timeout_s)
    info = {"ok": res.rc == 0 and not res.timed_out, "wall_s": res.wall_s}
    text = res.stdout + "\n" + res.stderr
    if not info["ok"]:
        ops = unsupported_ops(text)
        info["status"] = f"unsupported: {ops}" if ops else f"compile error: {res.error_text()}"
        return info
    m = re.search(r"arena (\d+) bytes, lower bound (\d+) bytes, naive (\d+) bytes", text)
    if m:
        info["arena"], info["lower"], info["naive"] = (int(v) for v in m.groups())
    m = re.search(r"(\d+) steps", text)
    if m:
        info["steps"] = int(m.group(1))
    return info


def kiln_has_bench(kiln) -> bool:
    try:
        out = subprocess.run([kiln, "--help"], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return re.search(r"^\s+bench\s", out.stdout, re.M) is not None


def kiln_bench(kiln, package, iterations, warmup, threads, timeout_s, inputs):
    """Times the package on `inputs` ([(name, .npy path, ...)]), the same data the other engines get."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    feeds = [a for n, p, _ in inputs for a in ("--input", f"{n}={p}")]
    return run_measured([kiln, "bench", package, "--iterations", str(iterations), "--warmup", str(warmup), "--json"]
                        + feeds, timeout_s, env)


# ---------------------------------------------------------------------------
# Agreement
# ---------------------------------------------------------------------------

def compare_outputs(reference_dir, candidate_dir, names):
    """(max abs err, max rel err) over all outputs; rel = max|a - r| / max|r| per output."""
    worst_abs, worst_rel = 0.0, 0.0
    for name in names:
        ref = np.load(os.path.join(reference_dir, safe_name(name) + ".npy"))
        cand_path = os.path.join(candidate_dir, safe_name(name) + ".npy")
        if not os.path.exists(cand_path):
            raise RuntimeError(f"no output {name!r}")
        cand = np.load(cand_path)
        if cand.shape != ref.shape:
            raise RuntimeError(f"output {name!r}: shape {list(cand.shape)}, onnxruntime {list(ref.shape)}")
        ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
        if not np.isfinite(cand64).all():
            return float("inf"), float("inf")
        diff = float(np.max(np.abs(cand64 - ref64))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref64))) if ref.size else 0.0
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")))
    return worst_abs, worst_rel


def output_names(model_path):
    import onnx
    model = onnx.load(model_path, load_external_data=False)
    return [o.name for o in model.graph.output]


# ---------------------------------------------------------------------------
# One model
# ---------------------------------------------------------------------------

def bench_model(name, args, kiln_bench_ok, log):
    model_path = os.path.join(args.models_dir, f"{name}.onnx")
    work = os.path.join(args.work_dir, name)
    os.makedirs(work, exist_ok=True)
    lat_iters, thr_iters = ITERATIONS.get(name, (100, 20))
    warmup = 10
    if args.quick:
        lat_iters, thr_iters, warmup = max(5, lat_iters // 20), max(3, thr_iters // 5), 2
    outputs = output_names(model_path)
    in1, dims1 = write_inputs(model_path, 1, os.path.join(work, "inputs_b1"))
    in8, dims8 = write_inputs(model_path, args.throughput_batch, os.path.join(work, f"inputs_b{args.throughput_batch}"))
    rows = {}
    extra = {}

    # onnxruntime first: it is the reference for agreement.
    ort_out = os.path.join(work, "out_onnxruntime")
    for engine in ("onnxruntime", "openvino"):
        if engine not in args.engines and not (engine == "onnxruntime"):
            continue
        row = rows[engine] = {"status": "ok"}
        out_dir = os.path.join(work, f"out_{engine}")
        log(f"  {engine}: batch 1, {lat_iters} runs")
        res = run_worker(engine, model_path, in1, dims1, lat_iters, warmup, args.threads, out_dir, args.timeout)
        data = res.last_json()
        if res.rc != 0 or data is None:
            row["status"] = f"error: {res.error_text()}"
            continue
        row.update(p50=data["p50_ms"], p90=data["p90_ms"], rss=res.peak_rss_mib, baseline=data["baseline_rss_mib"])
        if engine != "onnxruntime":
            try:
                row["abs"], row["rel"] = compare_outputs(ort_out, out_dir, outputs)
            except Exception as e:  # noqa: BLE001 - reported in the table
                row["status"] = f"error: {e}"
        log(f"  {engine}: batch {args.throughput_batch}, {thr_iters} runs")
        res = run_worker(engine, model_path, in8, dims8, thr_iters, max(1, warmup // 5), args.threads, None,
                         args.timeout)
        data = res.last_json()
        if res.rc != 0 or data is None:
            row["status"] = f"batch {args.throughput_batch} error: {res.error_text()}"
        else:
            row["throughput"] = data["throughput_per_s"]
    if "onnxruntime" not in args.engines:
        rows.pop("onnxruntime", None)
    ort_ok = rows.get("onnxruntime", {}).get("status") == "ok" or os.path.exists(ort_out)

    if "kiln" in args.engines:
        row = rows["kiln"] = {"status": "ok"}
        pkg1 = os.path.join(work, f"{name}_b1.kiln")
        log("  kiln: compile at batch 1")
        comp = kiln_compile(args.kiln, model_path, pkg1, in1, args.timeout)
        extra["compile"] = comp
        if not comp["ok"]:
            row["status"] = comp["status"]
        else:
            out_dir = os.path.join(work, "out_kiln")
            os.makedirs(out_dir, exist_ok=True)
            for f in os.listdir(out_dir):
                os.remove(os.path.join(out_dir, f))
            cmd = [args.kiln, "run", pkg1, "--output-dir", out_dir] + [a for n, p, _ in in1 for a in ("--input",
                                                                                                     f"{n}={p}")]
            res = run_measured(cmd, args.timeout, dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
            if res.rc != 0:
                row["status"] = f"run error: {res.error_text()}"
            elif ort_ok:
                try:
                    row["abs"], row["rel"] = compare_outputs(ort_out, out_dir, outputs)
                except Exception as e:  # noqa: BLE001
                    row["status"] = f"error: {e}"
            if row["status"] == "ok" and not kiln_bench_ok:
                row["status"] = "no timing: this kiln has no `bench` subcommand"
            if row["status"] == "ok":
                log(f"  kiln: bench batch 1, {lat_iters} runs")
                res = kiln_bench(args.kiln, pkg1, lat_iters, warmup, args.threads, args.timeout, in1)
                data = res.last_json()
                if res.rc != 0 or data is None:
                    row["status"] = f"bench error: {res.error_text()}"
                else:
                    row.update(p50=data["p50_ms"], p90=data["p90_ms"], rss=res.peak_rss_mib,
                               self_rss=data.get("peak_rss_mib"))
                    extra["bench_b1"] = data
                pkg8 = os.path.join(work, f"{name}_b{args.throughput_batch}.kiln")
                log(f"  kiln: compile and bench at batch {args.throughput_batch}, {thr_iters} runs")
                comp8 = kiln_compile(args.kiln, model_path, pkg8, in8, args.timeout)
                if not comp8["ok"]:
                    row["status"] = f"batch {args.throughput_batch}: {comp8['status']}"
                else:
                    res = kiln_bench(args.kiln, pkg8, thr_iters, max(1, warmup // 5), args.threads, args.timeout, in8)
                    data = res.last_json()
                    if res.rc != 0 or data is None:
                        row["status"] = f"batch {args.throughput_batch} bench error: {res.error_text()}"
                    else:
                        row["throughput"] = args.throughput_batch * 1000.0 / data["mean_ms"]

    # More rounds of the batch-1 latency, the engines taking turns, so that a slow spell of this shared
    # machine does not decide one engine's figure: each engine keeps its best round's p50 (and that
    # round's p90).
    pkg1 = os.path.join(work, f"{name}_b1.kiln")
    for round_index in range(1, args.rounds):
        for engine, row in rows.items():
            if row.get("status") != "ok" or row.get("p50") is None:
                continue
            log(f"  {engine}: batch 1, round {round_index + 1} of {args.rounds}")
            if engine == "kiln":
                res = kiln_bench(args.kiln, pkg1, lat_iters, warmup, args.threads, args.timeout, in1)
            else:
                res = run_worker(engine, model_path, in1, dims1, lat_iters, warmup, args.threads, None, args.timeout)
            data = res.last_json()
            if res.rc == 0 and data is not None and data["p50_ms"] < row["p50"]:
                row.update(p50=data["p50_ms"], p90=data["p90_ms"])

    for engine, row in rows.items():
        if row.get("status") == "ok" and "rel" in row and row["rel"] > REL_TOLERANCE:
            row["status"] = f"differs (rel > {REL_TOLERANCE:g})"
    return rows, extra


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def fmt(value, spec=".3f", suffix=""):
    if value is None:
        return "-"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    return f"{value:{spec}}{suffix}"


def fmt_err(value):
    return "-" if value is None else ("0" if value == 0 else f"{value:.2e}")


def ratio(a, b):
    if a is None or b is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def machine_info():
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
            mem = f"{kib / 2 ** 20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    nproc = len(os.sched_getaffinity(0))
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return (f"nproc {nproc}, CPU {cpu}, memory {mem}, {platform.system()} {platform.release()}, "
            f"load average at the start {load}")


def versions(kiln):
    parts = []
    try:
        out = subprocess.run([kiln, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        parts.append(f"kiln {out.split()[-1] if out else '?'}")
    except OSError:
        parts.append("kiln ?")
    for mod in ("onnxruntime", "openvino", "numpy", "onnx"):
        try:
            m = __import__(mod)
            parts.append(f"{mod} {getattr(m, '__version__', '?').split('-')[0]}")
        except ImportError:
            parts.append(f"{mod} not installed")
    return ", ".join(parts)


def render(results, args, command, started):
    lines = []
    lines.append("| model | engine | status | max abs err | max rel err | p50 (ms) | p90 (ms) | "
                 f"batch-{args.throughput_batch} throughput (/s) | peak RSS (MiB) | p50 vs ort | "
                 "throughput vs ort | RSS vs ort |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, (rows, _) in results.items():
        ort = rows.get("onnxruntime", {})
        for engine in ENGINES:
            if engine not in rows:
                continue
            r = rows[engine]
            is_ort = engine == "onnxruntime"
            lines.append("| " + " | ".join([
                model, engine, r["status"].replace("|", "\\|"),
                "(reference)" if is_ort else fmt_err(r.get("abs")),
                "(reference)" if is_ort else fmt_err(r.get("rel")),
                fmt(r.get("p50")), fmt(r.get("p90")), fmt(r.get("throughput"), ".1f"), fmt(r.get("rss"), ".1f"),
                "-" if is_ort else ratio(r.get("p50"), ort.get("p50")),
                "-" if is_ort else ratio(r.get("throughput"), ort.get("throughput")),
                "-" if is_ort else ratio(r.get("rss"), ort.get("rss")),
            ]) + " |")
    table = "\n".join(lines)

    plan = ["| model | kiln steps | arena (bytes) | lower bound (bytes) | arena / lower bound | compile (s) |",
            "|---|---:|---:|---:|---:|---:|"]
    any_plan = False
    for model, (_, extra) in results.items():
        comp = extra.get("compile")
        if comp and comp.get("ok"):
            any_plan = True
            plan.append(f"| {model} | {comp.get('steps', '-')} | {comp.get('arena', '-')} | {comp.get('lower', '-')} | "
                        f"{ratio(comp.get('arena'), comp.get('lower')) if comp.get('lower') else '-'} | "
                        f"{comp['wall_s']:.2f} |")
    notes = []
    chain = results.get("chain1000")
    if chain and chain[0].get("kiln", {}).get("p50") is not None:
        p50 = chain[0]["kiln"]["p50"]
        ort_p50 = chain[0].get("onnxruntime", {}).get("p50")
        ort_ns = f"{ort_p50 * 1e6 / 1000:.1f} ns" if ort_p50 is not None else "-"
        notes.append(f"- chain1000: kiln's batch-1 p50 over 1,000 nodes is {p50 * 1e6 / 1000:.1f} ns per node "
                     f"(acceptance: under 100 ns; onnxruntime {ort_ns}).")
    wins = [m for m, (rows, _) in results.items()
            if rows.get("kiln", {}).get("p50") is not None and rows.get("onnxruntime", {}).get("p50") is not None
            and rows["kiln"]["p50"] <= rows["onnxruntime"]["p50"]]
    notes.append(f"- kiln's batch-1 p50 is no worse than onnxruntime's on {len(wins)} of {len(results)} models"
                 + (f" ({', '.join(wins)})." if wins else "."))
    for engine in ("onnxruntime", "openvino"):
        base = [rows[engine].get("baseline") for rows, _ in results.values()
                if rows.get(engine, {}).get("baseline") is not None]
        if base:
            held = f"{min(base):.0f}" if round(min(base)) == round(max(base)) else f"{min(base):.0f}–{max(base):.0f}"
            notes.append(f"- {engine} runs in Python: its process held {held} MiB after "
                         "`import` and before loading the model; that is part of its peak RSS.")
    load1 = os.getloadavg()[0] if args.load_at_start is None else args.load_at_start
    if load1 > 0.5 * len(os.sched_getaffinity(0)):
        notes.append(f"- The machine was busy with other work (1-minute load average {load1:.2f} at the start on "
                     f"{len(os.sched_getaffinity(0))} CPUs): timings, tails (p90) and batch-{args.throughput_batch} "
                     "means most, are noisy; re-run on an idle machine for figures to quote.")
    body = [
        "## Model comparison",
        "",
        f"Command: `{command}`",
        "",
        f"Date: {started:%Y-%m-%d %H:%M} UTC. Machine: {args.machine}. Versions: {versions(args.kiln)}.",
        "",
        "Models from `bench/models/make_models.py` (random weights, fixed seeds); every engine gets the same "
        "random inputs. Latency: batch 1, "
        f"{args.threads} threads, p50/p90 of {'a quick run' if args.quick else 'the runs'} after warm-up, "
        f"the engines taking turns over {args.rounds} round{'s' if args.rounds != 1 else ''} (each engine's best "
        "round counts; its p90 is that round's). "
        f"Throughput: batch {args.throughput_batch}, {args.throughput_batch} × 1000 / mean ms. "
        "Errors are against onnxruntime's outputs at batch 1: max abs err = max|x − ort|, "
        "max rel err = max|x − ort| / max|ort| (worst output). Peak RSS: `ru_maxrss` of the batch-1 latency "
        "process alone (wait4). onnxruntime: Python, `intra_op_num_threads=2`, all graph optimisations, "
        "static dims. OpenVINO: Python, CPU, `INFERENCE_NUM_THREADS=2`, `INFERENCE_PRECISION_HINT=f32`, "
        "LATENCY hint, static shapes. kiln: `kiln bench --json` (`OMP_NUM_THREADS=2`). Ratios: the row's "
        "engine ÷ onnxruntime (p50 and RSS: lower is better; throughput: higher is better).",
        "",
        table,
        "",
    ]
    if any_plan:
        body += ["kiln's compile at batch 1 (`--plan-report`):", "", "\n".join(plan), ""]
    body += notes + [""]
    return "\n".join(body), table


def write_results(path, section, heading="## Model comparison"):
    """Replaces the section under `heading` in the results file with `section` (or appends it)."""
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.startswith(heading)), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    with open(path + ".tmp", "w") as f:
        f.write(new.rstrip("\n") + "\n")
    os.replace(path + ".tmp", path)


def publish(table, results, heading, write=True):
    """Prints a bench script's table and, unless `write` is false
    (--no-write), puts it in the results file under `heading`."""
    print(table)
    if write:
        write_results(results, table, heading)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="kiln vs onnxruntime vs OpenVINO on the benchmark models")
    parser.add_argument("--models", default=",".join(make_models.MODELS),
                        help="comma-separated models (default: all): " + ",".join(make_models.MODELS))
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    parser.add_argument("--models-dir", default=os.path.join(ROOT, "build/bench/models"))
    parser.add_argument("--work-dir", default=os.path.join(ROOT, "build/bench/compare"))
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build/release/tools/kiln"))
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    parser.add_argument("--no-write", action="store_true", help="print the table, leave RESULTS.md alone")
    parser.add_argument("--quick", action="store_true", help="few iterations, for a fast check")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--throughput-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the batch-1 latency, engines taking turns; the best round's p50 counts")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per subprocess")
    # Worker mode (internal).
    parser.add_argument("--worker", choices=["onnxruntime", "openvino"], help=argparse.SUPPRESS)
    parser.add_argument("--model-file", help=argparse.SUPPRESS)
    parser.add_argument("--input", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--dims", default="", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--save-outputs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        args.model = args.model_file
        return worker_main(args)

    started = datetime.datetime.now(datetime.timezone.utc)
    args.machine = machine_info()
    args.load_at_start = os.getloadavg()[0]
    command = " ".join(shlex.quote(a) for a in ["bench/compare.py"] + (sys.argv[1:] if argv is None else argv))
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in make_models.MODELS]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)}")
    args.engines = [e for e in args.engines.split(",") if e]
    if any(e not in ENGINES for e in args.engines):
        parser.error(f"engines must be among {', '.join(ENGINES)}")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    missing = [m for m in names if not os.path.exists(os.path.join(args.models_dir, f"{m}.onnx"))]
    if missing:
        log(f"building {', '.join(missing)} into {args.models_dir}")
        make_models.main([args.models_dir, "--models", ",".join(missing), "--quiet"])
    if "kiln" in args.engines and not os.access(args.kiln, os.X_OK):
        parser.error(f"{args.kiln} is not an executable (build kiln first, or pass --kiln)")
    has_bench = "kiln" in args.engines and kiln_has_bench(args.kiln)

    results = {}
    for name in names:
        log(f"{name}:")
        results[name] = bench_model(name, args, has_bench, log)
    section, table = render(results, args, command, started)
    print(table)
    if not args.no_write:
        write_results(args.results, section)
        log(f"wrote the '## Model comparison' section of {os.path.relpath(args.results, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
