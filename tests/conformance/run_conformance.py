"""Runs the ONNX backend node tests through kiln and through onnxruntime.

    python tests/conformance/run_conformance.py [--backend kiln|onnxruntime|both]
        [--tests DIR] [--results DIR] [--filter SUBSTRING] [--jobs N] [--write-docs docs/conformance.md]
        [--update-expected]

For each test (a directory with model.onnx and test_data_set_N/), kiln
compiles the model with the input shapes of each data set, runs it and
compares every output with the test's expected output using the test's own
rtol/atol (the rule of onnx's backend test runner: same dtype, same shape,
np.testing.assert_allclose). onnxruntime runs the same models the same way,
so both pass rates come from one harness.

Each test ends as one of:
  pass         every output of every data set matches
  fail         an output differs (wrong values, shape or dtype)
  unsupported  kiln reports an operator or dtype it has no schema/kernel for
  error        compiling or running raised another error
  crash        the worker process died (the test is then retried alone)

Tests run in worker processes so that a crash costs one test, not the run.
tests/conformance/excluded.txt lists the tests left out of the adjusted rate
(training-only and string operators, sequence and optional values; each with
its reason).
tests/conformance/expected_pass.txt lists the tests kiln passed when it was
last updated: the run exits 1 if any of them no longer passes, so CI catches
regressions. --update-expected rewrites it from this run.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXCLUDED = os.path.join(HERE, "excluded.txt")
EXPECTED = os.path.join(HERE, "expected_pass.txt")
STATUSES = ("pass", "fail", "unsupported", "error", "crash")


# ----------------------------------------------------------------------------
# Worker side: runs tests named on stdin, one JSON result per line on stdout.

def load_tensor(path: str, type_proto):
    import onnx
    from onnx import numpy_helper
    data = open(path, "rb").read()
    if type_proto.HasField("sequence_type"):
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if type_proto.HasField("optional_type"):
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    proto = onnx.TensorProto()
    proto.ParseFromString(data)
    return numpy_helper.to_array(proto)


def load_data_sets(test_dir: str, model):
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [value for value in graph.input if value.name not in initializers]
    data_sets = []
    for entry in sorted(os.listdir(test_dir)):
        data_dir = os.path.join(test_dir, entry)
        if not entry.startswith("test_data_set_"):
            continue
        feeds = {}
        for j, value in enumerate(inputs):
            path = os.path.join(data_dir, f"input_{j}.pb")
            if os.path.exists(path):
                feeds[value.name] = load_tensor(path, value.type)
        expected = []
        for j, value in enumerate(graph.output):
            expected.append(load_tensor(os.path.join(data_dir, f"output_{j}.pb"), value.type))
        data_sets.append((feeds, expected))
    return data_sets


def compare(name: str, expected, actual, rtol: float, atol: float) -> str | None:
    """None when `actual` matches `expected` by the backend runner's rule."""
    import numpy as np
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{name}: expected a sequence of {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            message = compare(f"{name}[{i}]", e, a, rtol, atol)
            if message:
                return message
        return None
    if expected is None:
        return None if actual is None else f"{name}: expected an empty optional"
    actual = np.asarray(actual)
    if actual.dtype != expected.dtype:
        return f"{name}: dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"{name}: shape {actual.shape}, expected {expected.shape}"
    if expected.dtype == object:
        return None if actual.tolist() == expected.tolist() else f"{name}: values differ"
    try:
        np.testing.assert_allclose(actual.astype(np.float64) if expected.dtype.kind == "V" else actual,
                                   expected.astype(np.float64) if expected.dtype.kind == "V" else expected,
                                   rtol=rtol, atol=atol)
    except AssertionError as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        return f"{name}: " + " ".join(lines[1:4])[:300]
    return None


class KilnBackend:
    def __init__(self):
        import kiln
        self.kiln = kiln
        self.scratch = tempfile.mkdtemp(prefix="kiln-conformance-")

    def run(self, model_path: str, model, feeds: dict):
        import numpy as np
        package = os.path.join(self.scratch, "model.kiln")
        shapes = {name: list(np.asarray(value).shape) for name, value in feeds.items()
                  if not isinstance(value, list) and value is not None}
        self.kiln.compile(model_path, package, shapes=shapes)
        runner = self.kiln.Runner(package, threads=1)
        outputs = runner.run(feeds)
        return [outputs[value.name] for value in model.graph.output]

    @staticmethod
    def classify(error: Exception) -> str:
        text = str(error)
        if "Unsupported" in text or "no kernel" in text or "not supported" in text:
            return "unsupported"
        return "error"


class OnnxruntimeBackend:
    def __init__(self):
        import onnxruntime
        self.ort = onnxruntime
        self.options = onnxruntime.SessionOptions()
        self.options.intra_op_num_threads = 1
        self.options.log_severity_level = 4

    def run(self, model_path: str, model, feeds: dict):
        session = self.ort.InferenceSession(model_path, self.options, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)

    @staticmethod
    def classify(error: Exception) -> str:
        text = str(error)
        if "NOT_IMPLEMENTED" in text or "not implemented" in text.lower():
            return "unsupported"
        return "error"


def run_one(backend, test_dir: str, tolerances: dict) -> dict:
    import onnx
    name = os.path.basename(test_dir)
    model_path = os.path.join(test_dir, "model.onnx")
    started = time.perf_counter()
    try:
        model = onnx.load(model_path)
        tolerance = tolerances.get(name, {"rtol": 1e-3, "atol": 1e-7})
        for feeds, expected in load_data_sets(test_dir, model):
            actual = backend.run(model_path, model, feeds)
            for value, e, a in zip(model.graph.output, expected, actual):
                message = compare(value.name, e, a, tolerance["rtol"], tolerance["atol"])
                if message:
                    return {"test": name, "status": "fail", "detail": message}
        return {"test": name, "status": "pass", "seconds": round(time.perf_counter() - started, 4)}
    except Exception as error:  # noqa: BLE001 - every error is a result here
        detail = f"{type(error).__name__}: {error}".replace("\n", " ")[:400]
        return {"test": name, "status": backend.classify(error), "detail": detail}


def worker(backend_name: str, tests_dir: str) -> int:
    backend = KilnBackend() if backend_name == "kiln" else OnnxruntimeBackend()
    with open(os.path.join(tests_dir, "tolerances.json")) as f:
        tolerances = json.load(f)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        try:
            result = run_one(backend, os.path.join(tests_dir, name), tolerances)
        except BaseException:  # noqa: BLE001
            result = {"test": name, "status": "error", "detail": traceback.format_exc()[-400:]}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------
# Driver side.

def start_worker(backend: str, tests_dir: str) -> subprocess.Popen:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", backend, "--tests", tests_dir],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)


def run_tests(backend: str, tests_dir: str, names: list[str], jobs: int) -> dict[str, dict]:
    """Runs `names` over `jobs` workers; a worker that dies is replaced and the
    test it was on is recorded as a crash."""
    import selectors
    pending = list(reversed(names))
    results: dict[str, dict] = {}
    selector = selectors.DefaultSelector()
    in_flight: dict[subprocess.Popen, str] = {}

    def feed(process: subprocess.Popen) -> None:
        if pending:
            name = pending.pop()
            in_flight[process] = name
            process.stdin.write(name + "\n")
            process.stdin.flush()
        else:
            process.stdin.close()
            selector.unregister(process.stdout)
            process.wait()

    def spawn() -> None:
        process = start_worker(backend, tests_dir)
        selector.register(process.stdout, selectors.EVENT_READ, process)
        feed(process)

    for _ in range(min(jobs, len(names))):
        spawn()
    done = 0
    while selector.get_map():
        for key, _ in selector.select():
            process = key.data
            line = process.stdout.readline()
            name = in_flight.pop(process, None)
            if not line:  # the worker died on `name`
                selector.unregister(process.stdout)
                process.wait()
                if name is not None:
                    results[name] = {"test": name, "status": "crash",
                                     "detail": f"worker exited with status {process.returncode}"}
                if pending:
                    spawn()
                continue
            result = json.loads(line)
            results[result["test"]] = result
            done += 1
            if done % 200 == 0:
                print(f"  {backend}: {done}/{len(names)}", file=sys.stderr, flush=True)
            feed(process)
    return results


def read_list(path: str) -> dict[str, str]:
    """Lines of 'name-or-glob  # reason'; returns {pattern: reason}."""
    entries = {}
    if not os.path.exists(path):
        return entries
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, _, reason = line.partition("#")
        entries[pattern.strip()] = reason.strip()
    return entries


def excluded_reason(name: str, exclusions: dict[str, str]) -> str | None:
    for pattern, reason in exclusions.items():
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


def op_of(test_dir: str) -> str:
    """The operator a test is about: its graph's only operator; for an
    `_expanded` test (the operator's function body), that of the test it
    expands; else the graph's last operator."""
    import re
    import onnx
    base = re.sub(r"_expanded(_ver\d+)?$", "", test_dir)
    if base != test_dir and os.path.exists(os.path.join(base, "model.onnx")):
        return op_of(base)
    model = onnx.load(os.path.join(test_dir, "model.onnx"), load_external_data=False)
    ops = [node.op_type for node in model.graph.node]
    return ops[0] if len(set(ops)) == 1 else (ops[-1] if ops else "?")


def rate(results: dict[str, dict], names: list[str]) -> tuple[int, int, float]:
    passed = sum(1 for name in names if results.get(name, {}).get("status") == "pass")
    return passed, len(names), 100.0 * passed / max(1, len(names))


def write_docs(path: str, tests_dir: str, names: list[str], exclusions: dict[str, str],
               all_results: dict[str, dict[str, dict]]) -> None:
    import onnx
    kept = [name for name in names if excluded_reason(name, exclusions) is None]
    lines = ["# ONNX backend node tests: kiln and onnxruntime",
             "",
             f"Generated by `make conformance` (`tests/conformance/run_conformance.py`) from the node tests "
             f"of onnx {onnx.__version__} ({len(names)} tests), each compiled and run with the input shapes of its "
             "data sets and compared with the test's own tolerances. onnxruntime runs the same tests through the "
             "same harness. Do not edit: rerun `make conformance`.",
             "",
             "Most of onnxruntime's errors are models it does not load: operator set versions newer than the "
             "onnxruntime release pinned in requirements.txt supports, element types it has no numpy mapping for "
             "(bfloat16, float8, 4-bit), or operators it does not implement; the per-operator table shows where.",
             "",
             "| backend | passed, all tests | passed, without exclusions |",
             "|---|---:|---:|"]
    for backend, results in all_results.items():
        p, n, r = rate(results, names)
        pk, nk, rk = rate(results, kept)
        lines.append(f"| {backend} | {p} / {n} ({r:.1f}%) | {pk} / {nk} ({rk:.1f}%) |")
    lines += ["", "Status counts:", "", "| backend | " + " | ".join(STATUSES) + " |",
              "|---|" + "---:|" * len(STATUSES)]
    for backend, results in all_results.items():
        counts = Counter(result["status"] for result in results.values())
        lines.append(f"| {backend} | " + " | ".join(str(counts.get(s, 0)) for s in STATUSES) + " |")
    lines += ["", "## Exclusions", "",
              "Training-only and string operators, and sequence and optional values (not supported yet), left out of the adjusted rate:", "",
              "| pattern | reason |", "|---|---|"]
    for pattern, reason in exclusions.items():
        lines.append(f"| `{pattern}` | {reason} |")
    by_op = defaultdict(list)
    for name in names:
        by_op[op_of(os.path.join(tests_dir, name))].append(name)
    backends = list(all_results)
    lines += ["", "## Per operator", "",
              "Tests passed out of the operator's tests (an `_expanded` test, the operator's function body, "
              "counts under the operator it expands; another test with several operators under its graph's last "
              "one). Failing kiln tests are named below the table.", "",
              "| operator | tests | " + " | ".join(backends) + " |", "|---|---:|" + "---:|" * len(backends)]
    for op in sorted(by_op, key=str.lower):
        tests = by_op[op]
        cells = []
        for backend in backends:
            passed = sum(1 for t in tests if all_results[backend].get(t, {}).get("status") == "pass")
            cells.append(str(passed))
        lines.append(f"| {op} | {len(tests)} | " + " | ".join(cells) + " |")
    if "kiln" in all_results:
        lines += ["", "## kiln tests that do not pass", "", "| test | status | detail |", "|---|---|---|"]
        for name in names:
            result = all_results["kiln"].get(name, {})
            if result.get("status") != "pass":
                detail = result.get("detail", "").replace("|", "\\|")[:160]
                reason = excluded_reason(name, exclusions)
                status = result.get("status", "?") + (" (excluded)" if reason else "")
                lines.append(f"| {name} | {status} | {detail} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="both", choices=["kiln", "onnxruntime", "both"])
    parser.add_argument("--tests", default=os.path.join(ROOT, "build", "conformance", "node"))
    parser.add_argument("--results", default=os.path.join(ROOT, "build", "conformance"),
                        help="where results-<backend>.json (every test's status and detail) go")
    parser.add_argument("--filter", default="", help="only tests whose name contains this")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--write-docs", default="")
    parser.add_argument("--update-expected", action="store_true")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.tests)

    names = sorted(name for name in os.listdir(args.tests)
                   if os.path.exists(os.path.join(args.tests, name, "model.onnx")) and args.filter in name)
    exclusions = read_list(EXCLUDED)
    kept = [name for name in names if excluded_reason(name, exclusions) is None]
    backends = ["kiln", "onnxruntime"] if args.backend == "both" else [args.backend]
    all_results = {}
    for backend in backends:
        started = time.perf_counter()
        results = run_tests(backend, args.tests, names, args.jobs)
        all_results[backend] = results
        os.makedirs(args.results, exist_ok=True)
        with open(os.path.join(args.results, f"results-{backend}.json"), "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
        p, n, r = rate(results, names)
        pk, nk, rk = rate(results, kept)
        counts = Counter(result["status"] for result in results.values())
        print(f"{backend}: {p}/{n} passed ({r:.1f}%), {pk}/{nk} without exclusions ({rk:.1f}%); "
              + ", ".join(f"{s} {counts.get(s, 0)}" for s in STATUSES)
              + f"; {time.perf_counter() - started:.0f} s")

    status = 0
    if "kiln" in all_results and not args.filter:
        results = all_results["kiln"]
        passing = sorted(name for name, result in results.items() if result["status"] == "pass")
        if args.update_expected:
            with open(EXPECTED, "w") as f:
                f.write("# kiln's passing ONNX node tests; written by run_conformance.py --update-expected\n")
                f.write("\n".join(passing) + "\n")
        expected = read_list(EXPECTED)
        regressions = sorted(name for name in expected if results.get(name, {}).get("status") != "pass")
        if regressions:
            print(f"REGRESSION: {len(regressions)} test(s) that passed before do not pass now:")
            for name in regressions:
                print(f"  {name}: {results.get(name, {}).get('status')}: {results.get(name, {}).get('detail', '')}")
            status = 1
        new = sorted(set(passing) - set(expected))
        if new and not args.update_expected:
            print(f"{len(new)} test(s) pass that expected_pass.txt does not list; --update-expected adds them")
    if args.write_docs:
        write_docs(args.write_docs, args.tests, names, exclusions, all_results)
        print(f"wrote {args.write_docs}")
    return status


if __name__ == "__main__":
    sys.exit(main())
