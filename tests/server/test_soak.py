"""A soak of kiln serve: requests over HTTP and gRPC from several threads,
random sim device faults and random bad requests mixed in. Every good
request is answered exactly once, correctly or with the runner's error
(500/503 and their gRPC codes); every bad one with 400; nothing hangs; the
server's resident memory stays flat. `make test` runs KILN_SERVE_SOAK
requests (2,000 by default); `make soak` runs 100,000."""

import json
import os
import random
import threading
import time
import http.client

import numpy as np
import tritonclient.grpc as grpcclient

from conftest import Mlp, add_model

REQUESTS = int(os.environ.get("KILN_SERVE_SOAK", "2000"))
THREADS = 8


def resident_bytes(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("process_resident_memory_bytes")))


def test_soak(start_server, tmp_path, mlp_package):
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, config={"device": "sim", "max_queue_delay_microseconds": 200})
    server = start_server(repo, env={"KILN_SIM_DEVICES": "1", "KILN_SIM_FAULT_RATE": "reset=0.002,app=0.002"})
    reference = Mlp(0)
    outcomes = {"ok": 0, "device_error": 0, "bad": 0}
    problems = []
    lock = threading.Lock()
    per_thread = REQUESTS // THREADS
    rss = []

    def worker(index):
        rng = random.Random(index)
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        for k in range(per_thread):
            if index == 0 and k == per_thread // 5:
                rss.append(resident_bytes(server))  # after the warm-up
            rows = rng.randint(1, 8)
            x = np.random.default_rng(index * 1_000_003 + k).standard_normal((rows, 16)).astype(np.float32)
            bad = rng.random() < 0.1
            use_grpc = rng.random() < 0.5
            outcome = None
            try:
                if use_grpc:
                    shape = [rows, 15 if bad else 16]
                    inp = grpcclient.InferInput("x", shape, "FP32")
                    inp.set_data_from_numpy(np.zeros(shape, np.float32) if bad else x)
                    try:
                        y = grpc.infer("mlp", [inp], request_id=f"{index}-{k}").as_numpy("y")
                        outcome = ("answer", y)
                    except Exception as error:  # noqa: BLE001 - classified below
                        message = str(error)
                        if "INVALID_ARGUMENT" in message:
                            outcome = ("status", 400)
                        elif "UNAVAILABLE" in message:
                            outcome = ("status", 503)
                        elif "INTERNAL" in message:
                            outcome = ("status", 500)
                        else:
                            outcome = ("other", message)
                else:
                    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 16],
                                        "data": x.ravel().tolist()}]}
                    if bad:
                        body["inputs"][0]["shape"] = [rows + 9, 16]
                    connection.request("POST", "/v2/models/mlp/infer", body=json.dumps(body))
                    response = connection.getresponse()
                    data = response.read()
                    if response.status == 200:
                        outputs = {o["name"]: o for o in json.loads(data)["outputs"]}
                        outcome = ("answer", np.array(outputs["y"]["data"], np.float32).reshape(rows, 4))
                    else:
                        outcome = ("status", response.status)
            except Exception as error:  # noqa: BLE001 - a transport failure is a problem
                outcome = ("other", repr(error))
                connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
            with lock:
                kind, value = outcome
                if bad:
                    if kind == "status" and value == 400:
                        outcomes["bad"] += 1
                    else:
                        problems.append(("bad request not refused", kind, str(value)[:200]))
                elif kind == "answer":
                    if np.allclose(value, reference.reference(x)["y"], rtol=1e-4, atol=1e-4):
                        outcomes["ok"] += 1
                    else:
                        problems.append(("wrong answer", index, k))
                elif kind == "status" and value in (500, 503):
                    outcomes["device_error"] += 1
                else:
                    problems.append(("unexpected", kind, str(value)[:200]))
        connection.close()

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3600)
    assert not any(t.is_alive() for t in threads), "a request hung"
    elapsed = time.monotonic() - start
    assert problems == [], problems[:10]
    total = per_thread * THREADS
    assert sum(outcomes.values()) == total
    assert outcomes["ok"] > total * 0.8 and outcomes["bad"] > 0
    rss.append(resident_bytes(server))
    # Flat: allocator noise, not growth with the request count.
    assert rss[1] - rss[0] < 64 << 20, rss
    stats = json.loads(_get(server, "/v2/models/mlp/stats"))["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == outcomes["ok"]
    print(f"soak: {total} requests in {elapsed:.1f} s: {outcomes}; RSS {rss[0] >> 20} -> {rss[1] >> 20} MiB")


def _get(server, path):
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    connection.request("GET", path)
    data = connection.getresponse().read()
    connection.close()
    return data
