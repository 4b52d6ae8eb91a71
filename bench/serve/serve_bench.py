"""kiln serve under perf_analyzer, against KServe's Python model server with
onnxruntime inside, and against kiln's in-process ModelRunner.

For each model (bench/models: the MLP, overhead-bound, and MobileNetV2,
compute-bound), compiled with batch 8:
  - `kiln serve` over HTTP and gRPC at concurrency 1, 4, 16, 64;
  - KServe's server (bench/serve/kserve_onnx_server.py) over HTTP at the
    same concurrencies (its gRPC service has no ModelConfig method, which
    perf_analyzer needs);
  - bench/serve/runner_throughput with 16 client threads: the in-process
    ceiling.
Every server runs alone on this machine with perf_analyzer beside it (both
share the cores, as the client of a one-machine test must). Prints a
markdown table and the three goals of issue 16 as ratios.

    .venv-serve/bin/python bench/serve/serve_bench.py [--models mlp,mobilenetv2] [--interval-ms 3000]

With --pinned, the server (and the in-process run) get core 0 with one
kernel thread and perf_analyzer core 1, so that the client's work does not
come out of the server's share; only kiln is measured then, at concurrency
16, against the in-process ceiling on the same core.
"""

import argparse
import csv
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
KILN = REPO / "build/release/tools/kiln"
RUNNER_THROUGHPUT = REPO / "build/release/bench/runner_throughput"
PERF_ANALYZER = REPO / "bench/serve/perf_analyzer"
CONCURRENCIES = [1, 4, 16, 64]


SERVER_CPU, CLIENT_CPU = [], []  # taskset prefixes (--pinned)


def start(args, ready_pattern, log_path, env=None):
    log = open(log_path, "w")
    process = subprocess.Popen(SERVER_CPU + args, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(ready_pattern, pathlib.Path(log_path).read_text())
        if found:
            return process, found
        if process.poll() is not None:
            raise RuntimeError(f"{args[0]} exited:\n" + pathlib.Path(log_path).read_text())
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{args[0]} did not start:\n" + pathlib.Path(log_path).read_text())


def stop(process):
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def perf(model, url, protocol, concurrency, interval_ms, out_dir):
    csv_path = out_dir / f"pa-{model}-{protocol}-{concurrency}-{time.monotonic_ns()}.csv"
    args = CLIENT_CPU + [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol, "--concurrency-range", str(concurrency),
            "--measurement-interval", str(interval_ms), "--stability-percentage", "25", "--max-trials", "10",
            "-f", str(csv_path)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if result.returncode != 0 or not csv_path.exists():
        return {"error": (result.stdout + result.stderr).strip().splitlines()[-1:]}
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    return {"throughput": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
            "p99_us": float(row["p99 latency"])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,mobilenetv2")
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--out", default=str(REPO / "build/bench/serve"))
    parser.add_argument("--pinned", action="store_true", help="server on core 0, perf_analyzer on core 1")
    parser.add_argument("--concurrency", help="comma-separated concurrencies (default 1,4,16,64; pinned: 16)")
    parser.add_argument("--model-config", default="{}",
                        help="config.json of every model, e.g. '{\"adaptive_queue_delay\": 0}'")
    parser.add_argument("--no-baseline", action="store_true", help="skip KServe's server")
    args = parser.parse_args()
    model_config = json.loads(args.model_config)
    concurrencies = CONCURRENCIES
    env = None
    if args.pinned:
        SERVER_CPU.extend(["taskset", "-c", "0"])
        CLIENT_CPU.extend(["taskset", "-c", "1"])
        concurrencies = [16]
        env = {"OMP_NUM_THREADS": "1"}
    if args.concurrency:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.models.split(",")
    subprocess.run([sys.executable, str(REPO / "bench/models/make_models.py"), str(out / "onnx"), "--models",
                    ",".join(names), "--quiet"], check=True)
    repo = out / "repository"
    rows = []
    goals = []
    for name in names:
        onnx_path = out / "onnx" / f"{name}.onnx"
        package = repo / name / "1" / "model.kiln"
        package.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(KILN), "compile", str(onnx_path), "--batch", "8", "-o", str(package)], check=True,
                       capture_output=True)
        (repo / name / "config.json").write_text(json.dumps(model_config))
        results = {}
        server, found = start([str(KILN), "serve", "--model-repository", str(repo), "--http-port", "0",
                               "--grpc-port", "0", "--metrics-port", "-1"],
                              r"HTTP (\d+), gRPC (\d+)", out / f"kiln-{name}.log", env)
        http_port, grpc_port = found.groups()
        try:
            for c in concurrencies:
                results[("kiln serve", "http", c)] = perf(name, f"127.0.0.1:{http_port}", "http", c,
                                                          args.interval_ms, out)
                results[("kiln serve", "grpc", c)] = perf(name, f"127.0.0.1:{grpc_port}", "grpc", c,
                                                          args.interval_ms, out)
        finally:
            stop(server)
        if not args.pinned and not args.no_baseline:
            run_baseline(name, onnx_path, out, args.interval_ms, results)
        runner = subprocess.run(SERVER_CPU + [str(RUNNER_THROUGHPUT), str(package), "--clients", "16", "--seconds", "5",
                                              "--queue-delay-us", str(model_config.get("max_queue_delay_microseconds", 0)),
                                              "--adaptive", str(model_config.get("adaptive_queue_delay", 0.1))],
                                capture_output=True, text=True, check=True, env={**os.environ, **(env or {})})
        in_process = float(re.search(r'"requests_per_second": ([\d.]+)', runner.stdout).group(1))
        rows.extend(table_rows(name, results, in_process))
        goals.extend(goal_lines(name, results, in_process))
    table = ["| model | server | protocol | concurrency | infer/s | p50 ms | p99 ms |",
             "|---|---|---|---|---|---|---|", *rows]
    text = "\n".join(table) + "\n\n" + "\n".join(f"- {g}" for g in goals) + "\n"
    (out / ("results-pinned.md" if args.pinned else "results.md")).write_text(text)
    print(text)


def run_baseline(name, onnx_path, out, interval_ms, results):
    """KServe's server with onnxruntime over HTTP (SERVER_CPU does not apply:
    the baseline runs only unpinned)."""
    kserve, _ = start([sys.executable, str(REPO / "bench/serve/kserve_onnx_server.py"), str(onnx_path), "--name",
                       name, "--http-port", "18590", "--grpc-port", "18591", "--threads", "2"],
                      r"Uvicorn running|Application startup complete", out / f"kserve-{name}.log")
    try:
        for c in CONCURRENCIES:
            results[("KServe + onnxruntime", "http", c)] = perf(name, "127.0.0.1:18590", "http", c, interval_ms, out)
    finally:
        stop(kserve)


def table_rows(name, results, in_process):
    rows = []
    for (server_name, protocol, c), r in results.items():
        if "error" in r:
            rows.append(f"| {name} | {server_name} | {protocol} | {c} | failed: {r['error']} | | |")
        else:
            rows.append(f"| {name} | {server_name} | {protocol} | {c} | {r['throughput']:.0f} | "
                        f"{r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} |")
    rows.append(f"| {name} | in-process ModelRunner, 16 threads | - | 16 | {in_process:.0f} | | |")
    return rows


def goal_lines(name, results, in_process):
    goals = []
    measured = [r for p in ("http", "grpc") if "throughput" in (r := results.get(("kiln serve", p, 16), {}))]
    base16 = results.get(("KServe + onnxruntime", "http", 16), {})
    kiln_http16 = results.get(("kiln serve", "http", 16), {})
    if "throughput" in kiln_http16 and "throughput" in base16:
        goals.append(f"{name}: kiln serve / KServe at concurrency 16 over HTTP: "
                     f"{kiln_http16['throughput'] / base16['throughput']:.2f}x (goal >= 3)")
    if measured:
        best = max(measured, key=lambda r: r["throughput"])
        goals.append(f"{name}: kiln serve (best protocol) / in-process ModelRunner at 16: "
                     f"{best['throughput'] / in_process:.2f} (goal >= 0.9)")
        goals.append(f"{name}: kiln serve p99 / p50 at 16: {best['p99_us'] / best['p50_us']:.2f} (goal < 2)")
    return goals


if __name__ == "__main__":
    main()
