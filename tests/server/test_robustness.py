"""kiln serve under bad input, limits, faults and shutdown: bad requests get
400 with a clear message and change nothing; full queues, device faults and
draining answer as docs/serving.md says; the server keeps serving."""

import http.client
import json
import re
import struct
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import Mlp, add_model


def post(server, path, body, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    connection.request("POST", path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def get(server, path, port=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port or server.http_port, timeout=30)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def good_json(n=1):
    x = np.arange(n * 16, dtype=np.float32).reshape(n, 16) / 10
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [n, 16], "data": x.ravel().tolist()}]}), x


def binary_body(x, declared=None):
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                     "parameters": {"binary_data_size": declared or x.nbytes}}]}).encode()
    return header, header + x.tobytes()


BAD_REQUESTS = [
    ("malformed JSON", b'{"inputs": [', {}, "not valid JSON"),
    ("not an object", b"[1, 2]", {}, "JSON object"),
    ("no inputs", b'{"id": "x"}', {}, "inputs"),
    ("unknown input", json.dumps({"inputs": [{"name": "q", "datatype": "FP32", "shape": [1, 16],
                                              "data": [0] * 16}]}).encode(), {}, "no input 'q'"),
    ("wrong dtype", json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 16],
                                            "data": [0] * 16}]}).encode(), {}, "is FP32"),
    ("wrong shape", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 17],
                                            "data": [0] * 17}]}).encode(), {}, "shape"),
    ("too many rows", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 16],
                                              "data": [0] * 144}]}).encode(), {}, "1 to 8"),
    ("too few elements", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                                                 "data": [0] * 16}]}).encode(), {}, "needs 32"),
    ("string data", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                            "data": ["a"] * 16}]}).encode(), {}, "not a number"),
    ("unknown output", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                               "data": [0] * 16}], "outputs": [{"name": "w"}]}).encode(), {},
     "no output 'w'"),
    ("negative dimension", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 16],
                                                   "data": [0] * 16}]}).encode(), {}, ">= 0"),
    ("huge shape", json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1 << 40, 1 << 40],
                                           "data": [0]}]}).encode(), {}, "elements"),
]


@pytest.mark.parametrize("name,body,headers,message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_json_requests_are_400(server, name, body, headers, message):
    status, data = post(server, "/v2/models/mlp/infer", body, headers)
    assert status == 400, data
    assert message in json.loads(data)["error"]


def test_binary_extension_errors(server):
    x = np.ones((2, 16), np.float32)
    header, body = binary_body(x)
    # Truncated binary data.
    status, data = post(server, "/v2/models/mlp/infer", body[:-5],
                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and b"binary" in data
    # Extra bytes nobody claims.
    status, data = post(server, "/v2/models/mlp/infer", body + b"xx",
                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and b"no input claims" in data
    # A header length past the body, and one that is not a number.
    status, data = post(server, "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": "99999"})
    assert status == 400
    status, data = post(server, "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": "ten"})
    assert status == 400 and b"byte count" in data
    # binary_data_size without the header.
    status, data = post(server, "/v2/models/mlp/infer", header)
    assert status == 400 and b"Inference-Header-Content-Length" in data
    # The right thing still works, binary both ways.
    status, data = post(server, "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200


def test_bad_requests_change_nothing(server):
    for _, body, headers, _ in BAD_REQUESTS:
        post(server, "/v2/models/mlp/infer", body, headers)
    body, x = good_json(3)
    status, data = post(server, "/v2/models/mlp/infer", body)
    assert status == 200
    y = np.array(json.loads(data)["outputs"][0]["data"], np.float32).reshape(3, 4)
    np.testing.assert_allclose(y, Mlp(0).reference(x)["y"], rtol=1e-5, atol=1e-5)
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("mlp")["model_stats"][0]
    # Requests the model refused count as failures; ones that never parsed
    # did not reach it (the metrics count those: test_metrics_page).
    assert 1 <= int(stats["inference_stats"]["fail"]["count"]) <= len(BAD_REQUESTS)
    assert int(stats["inference_stats"]["success"]["count"]) == 1
    assert int(stats["inference_count"]) == 3


def test_grpc_bad_requests(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("x", [1, 15], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 15), np.float32))
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT"):
        client.infer("mlp", [inp])
    inp = grpcclient.InferInput("x", [1, 16], "FP64")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float64))
    with pytest.raises(InferenceServerException, match="is FP32"):
        client.infer("mlp", [inp])
    inp = grpcclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.infer("nope", [inp])
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.infer("mlp", [inp], model_version="3")
    assert client.infer("mlp", [inp]).as_numpy("y").shape == (1, 4)


def test_unknown_endpoint_and_model(server):
    status, data = get(server, "/v3/nothing")
    assert status == 404 and b"no such endpoint" in data
    status, data = post(server, "/v2/models/nope/infer", good_json()[0])
    assert status == 404 and b"not loaded" in data


def test_body_size_limit(start_server, repository):
    server = start_server(repository, ["--max-body-mib", "1"])
    x = np.zeros((8, 16), np.float32)
    header, body = binary_body(x)
    padded = body + b" " * (2 << 20)
    status, _ = post(server, "/v2/models/mlp/infer", padded, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 413
    status, _ = post(server, "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200


def test_tensor_element_limit(start_server, repository):
    server = start_server(repository, ["--max-tensor-elements", "100"])
    status, data = post(server, "/v2/models/mlp/infer", good_json(8)[0])
    assert status == 400 and b"more than 100 elements" in data
    status, _ = post(server, "/v2/models/mlp/infer", good_json(4)[0])
    assert status == 200


def test_bearer_token(start_server, repository, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    server = start_server(repository, ["--auth-token-file", token_file])
    status, _ = get(server, "/v2/health/live")
    assert status == 200  # health needs no token (orchestrators' probes)
    status, data = get(server, "/v2/models/mlp")
    assert status == 401 and b"token" in data
    status, _ = get(server, "/v2/models/mlp", headers={"Authorization": "Bearer wrong!"})
    assert status == 401
    status, _ = get(server, "/v2/models/mlp", headers={"Authorization": "Bearer s3cret"})
    assert status == 200
    http = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("mlp", [inp])
    assert http.infer("mlp", [inp], headers={"Authorization": "Bearer s3cret"}).as_numpy("y").shape == (1, 4)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        grpc.get_model_metadata("mlp")
    assert grpc.get_model_metadata("mlp", headers={"authorization": "Bearer s3cret"}).name == "mlp"


def test_listens_on_loopback_by_default(server):
    log = server.log()
    assert "listening on 127.0.0.1" in log


def test_second_server_cannot_share_a_port(start_server, repository, kiln_binary, tmp_path):
    import subprocess
    first = start_server(repository)
    result = subprocess.run([str(kiln_binary), "serve", "--model-repository", str(repository), "--http-port",
                             str(first.http_port), "--grpc-port", "0", "--metrics-port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cannot listen for HTTP" in result.stderr


def test_model_names_cannot_escape_the_repository(server, tmp_path):
    for name in ["..", ".hidden", "a%2F..%2F..", "%2e%2e"]:
        status, data = post(server, f"/v2/repository/models/{name}/load", b"")
        assert status in (400, 404), (name, status, data)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for name in ["../models", "/etc", "a/b", ".."]:
        with pytest.raises(InferenceServerException):
            client.load_model(name)
    assert client.is_model_ready("mlp")


SLOW_SIM = {"KILN_SIM_DEVICES": "1", "KILN_SIM_LATENCY_US": "100000"}  # 0.1 s per copy: a slow device


def test_full_queues_answer_503(start_server, tmp_path, mlp_package):
    """A slow device and a queue of 16 rows: 40 concurrent requests of 4
    rows cannot all wait; the ones that find no room get 503 at once."""
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, config={"device": "sim", "max_queue_rows": 16})
    server = start_server(repo, env=SLOW_SIM)
    results = []

    def one():
        status, data = post(server, "/v2/models/mlp/infer", good_json(4)[0])
        results.append((status, data))

    threads = [threading.Thread(target=one) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = [status for status, _ in results]
    assert statuses.count(200) >= 4 and statuses.count(503) >= 1, statuses
    assert set(statuses) <= {200, 503}
    assert all(b"queues are full" in data for status, data in results if status == 503)
    # And it serves again once the queue drained.
    assert post(server, "/v2/models/mlp/infer", good_json(1)[0])[0] == 200
    status, data = get(server, "/metrics", port=server.metrics_port)
    assert f'outcome="UNAVAILABLE"}} {statuses.count(503)}' in data.decode()


def test_request_timeout(start_server, tmp_path, mlp_package):
    """A request whose timeout passes while it waits behind others is not run."""
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, config={"device": "sim"})
    server = start_server(repo, env=SLOW_SIM)
    busy = [threading.Thread(target=post, args=(server, "/v2/models/mlp/infer", good_json(8)[0]))
            for _ in range(6)]
    for t in busy:
        t.start()
    time.sleep(0.1)
    body = json.loads(good_json(1)[0])
    body["parameters"] = {"timeout": 1000}  # microseconds
    status, data = post(server, "/v2/models/mlp/infer", json.dumps(body))
    assert status == 504 and b"deadline" in data.lower()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException, match="DEADLINE_EXCEEDED"):
        client.infer("mlp", [inp], client_timeout=0.05)
    for t in busy:
        t.join()
    assert client.infer("mlp", [inp]).as_numpy("y").shape == (1, 4)


def test_sim_device_faults_follow_the_error_table(start_server, tmp_path, mlp_package):
    """Scripted faults on a sim device: an application error (500) and a
    recoverable reset (503); the runner resets and the server keeps serving."""
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, config={"device": "sim", "max_queue_delay_microseconds": 100})
    server = start_server(repo, env={"KILN_SIM_DEVICES": "1", "KILN_SIM_FAULTS": "app@3,reset@6"})
    answers = []
    while [status for status, _ in answers].count(200) < 8 and len(answers) < 200:
        status, data = post(server, "/v2/models/mlp/infer", good_json(1)[0])
        answers.append((status, data))
        if status == 503:
            time.sleep(0.01)  # as a client does: retry after a moment
    statuses = [status for status, _ in answers]
    assert statuses.count(500) == 1, statuses  # the application error
    failed = [json.loads(data)["error"] for status, data in answers if status != 200]
    assert any("recovery action" in message for message in failed), failed  # the recoverable reset
    assert set(statuses) <= {200, 500, 503} and statuses[-1] == 200
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("mlp")["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == 8


def test_sigterm_drains_requests_in_flight(start_server, tmp_path, mlp_package):
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, config={"max_queue_delay_microseconds": 2_000_000})
    server = start_server(repo)
    results = []

    def one():
        results.append(post(server, "/v2/models/mlp/infer", good_json(1)[0])[0])

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the requests wait in a partial batch (2 s queue delay)
    start = time.monotonic()
    code = server.terminate()
    for t in threads:
        t.join()
    assert results == [200, 200, 200]
    assert code == 0
    assert time.monotonic() - start < 1.5  # drained at once, not after the queue delay
    assert "every request taken was answered" in server.log()


def test_metrics_page(server):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("x", [2, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((2, 16), np.float32))
    for _ in range(3):
        client.infer("mlp", [inp])
    post(server, "/v2/models/mlp/infer", b"{")
    grpcclient.InferenceServerClient(server.grpc_url).infer("mlp", [_grpc_input()])
    status, data = get(server, "/metrics", port=server.metrics_port)
    text = data.decode()
    assert status == 200
    assert 'kiln_requests_total{model="mlp",version="1",protocol="http",outcome="SUCCESS"} 3' in text
    assert 'kiln_requests_total{model="mlp",version="1",protocol="http",outcome="INVALID_ARGUMENT"} 1' in text
    assert 'kiln_requests_total{model="mlp",version="1",protocol="grpc",outcome="SUCCESS"} 1' in text
    assert 'kiln_request_duration_seconds_count{model="mlp",version="1"} 5' in text
    assert 'kiln_batch_rows_bucket{model="mlp",version="1",le="+Inf"}' in text
    assert "kiln_inflight_requests" in text and "process_resident_memory_bytes" in text
    assert "kiln_device_memory_bytes" in text
    # Queue and compute time histograms over the 4 requests that reached
    # the runner (the malformed one did not): cumulative buckets, then +Inf.
    for name in ("kiln_queue_duration_seconds", "kiln_compute_duration_seconds"):
        buckets = [int(v) for v in re.findall(name + r'_bucket\{model="mlp",version="1",le="[^"]+"\} (\d+)', text)]
        assert len(buckets) == 17 and buckets == sorted(buckets) and buckets[-1] == 4, (name, buckets)
        assert f'{name}_count{{model="mlp",version="1"}} 4' in text


def _grpc_input():
    inp = grpcclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    return inp


def test_access_log_and_trace(start_server, repository, tmp_path):
    log_path, trace_path = tmp_path / "access.log", tmp_path / "trace.json"
    server = start_server(repository, ["--access-log", log_path, "--trace-file", trace_path])
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    client.infer("mlp", [inp], request_id="abc")
    grpcclient.InferenceServerClient(server.grpc_url).infer("mlp", [_grpc_input()], request_id="def")
    assert server.terminate() == 0
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    infers = [line for line in lines if line.get("model") == "mlp"]
    assert {(l["protocol"], l["id"], l["outcome"], l["status"]) for l in infers} == \
        {("http", "abc", "SUCCESS", 200), ("grpc", "def", "SUCCESS", 200)}
    assert all(l["duration_ms"] >= 0 and "time" in l for l in lines)
    trace = json.loads(trace_path.read_text())
    assert {e["args"]["id"] for e in trace} == {"abc", "def"}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in trace)
