"""The KServe v2 protocol through Triton's own clients: every endpoint over
HTTP and gRPC, JSON and binary tensor data, streaming, against numpy's
answer for the same model."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import Mlp


def rows(n, seed=1):
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def test_health_and_server_metadata(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.is_server_live() and http.is_server_ready()
    assert grpc.is_server_live() and grpc.is_server_ready()
    for metadata in (http.get_server_metadata(), grpc.get_server_metadata(as_json=True)):
        assert metadata["name"] == "kiln"
        assert {"binary_tensor_data", "model_repository", "statistics"} <= set(metadata["extensions"])
    assert http.is_model_ready("mlp") and grpc.is_model_ready("mlp")
    assert http.is_model_ready("mlp", "1") and grpc.is_model_ready("mlp", "1")
    assert not http.is_model_ready("nope") and not grpc.is_model_ready("nope")
    assert not http.is_model_ready("mlp", "7") and not grpc.is_model_ready("mlp", "7")


def test_model_metadata_and_config(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for metadata in (http.get_model_metadata("mlp"), grpc.get_model_metadata("mlp", as_json=True)):
        assert metadata["name"] == "mlp" and metadata["versions"] == ["1"] and metadata["platform"] == "kiln"
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in metadata["inputs"]] == \
            [("x", "FP32", [-1, 16])]
        assert [t["name"] for t in metadata["outputs"]] == ["y", "z"]
    http_config = http.get_model_config("mlp")
    grpc_config = grpc.get_model_config("mlp", as_json=True)["config"]
    for config in (http_config, grpc_config):
        assert int(config["max_batch_size"]) == 8
        assert config["input"][0]["data_type"] == "TYPE_FP32"
        assert [int(d) for d in config["input"][0]["dims"]] == [16]
        assert "dynamic_batching" in config
    with pytest.raises(InferenceServerException, match="not loaded"):
        http.get_model_metadata("nope")
    with pytest.raises(InferenceServerException, match="not loaded"):
        grpc.get_model_metadata("nope")


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_json_and_binary(server, binary):
    client = httpclient.InferenceServerClient(server.http_url)
    x = rows(3)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary),
               httpclient.InferRequestedOutput("z", binary_data=not binary)]
    result = client.infer("mlp", [inp], outputs=outputs, request_id="r-7")
    expected = Mlp(0).reference(x)
    np.testing.assert_allclose(result.as_numpy("y"), expected["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("z"), expected["z"], rtol=1e-5, atol=1e-5)
    assert result.get_response()["id"] == "r-7"


def test_requested_outputs_subset(server):
    client = httpclient.InferenceServerClient(server.http_url)
    x = rows(2)
    inp = httpclient.InferInput("x", [2, 16], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp], outputs=[httpclient.InferRequestedOutput("z")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["z"]
    assert result.as_numpy("y") is None
    np.testing.assert_allclose(result.as_numpy("z"), Mlp(0).reference(x)["z"], rtol=1e-5, atol=1e-6)


def test_grpc_infer_raw_and_typed_contents(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = rows(5)
    inp = grpcclient.InferInput("x", [5, 16], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp], request_id="g1")
    np.testing.assert_allclose(result.as_numpy("y"), Mlp(0).reference(x)["y"], rtol=1e-5, atol=1e-5)
    assert result.get_response().id == "g1"

    # Typed contents (fp32_contents) instead of raw bytes, built by hand.
    from tritonclient.grpc import service_pb2
    request = service_pb2.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend(x[0].tolist())
    response = client._client_stub.ModelInfer(request)
    y = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(1, 4)
    np.testing.assert_allclose(y, Mlp(0).reference(x[:1])["y"], rtol=1e-5, atol=1e-5)


def test_grpc_streaming(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    inputs = {}
    for i in range(12):
        x = rows(1 + i % 3, seed=100 + i)
        inputs[f"s{i}"] = x
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        client.async_stream_infer("mlp", [inp], request_id=f"s{i}")
    # A bad request on the stream gets an error answer; the stream goes on.
    bad = grpcclient.InferInput("x", [1, 15], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 15), np.float32))
    client.async_stream_infer("mlp", [bad], request_id="bad")
    seen = {}
    errors = []
    for _ in range(13):
        result, error = answers.get(timeout=30)
        if error is not None:
            errors.append(str(error))
        else:
            seen[result.get_response().id] = result.as_numpy("y")
    client.stop_stream()
    assert len(errors) == 1 and "shape" in errors[0]
    assert sorted(seen) == sorted(inputs)
    for key, y in seen.items():
        np.testing.assert_allclose(y, Mlp(0).reference(inputs[key])["y"], rtol=1e-5, atol=1e-5)


def test_concurrent_requests_are_batched(start_server, tmp_path, mlp_package):
    """16 connections at once, each with its own thread and client; a queue
    delay of 2 ms lets their requests meet in device batches."""
    import concurrent.futures

    from conftest import add_model
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, config={"max_queue_delay_microseconds": 2000})
    server = start_server(repo)

    def one(i):
        client = httpclient.InferenceServerClient(server.http_url)
        for k in range(4):
            x = rows(1, seed=i * 10 + k)
            inp = httpclient.InferInput("x", [1, 16], "FP32")
            inp.set_data_from_numpy(x)
            y = client.infer("mlp", [inp]).as_numpy("y")
            np.testing.assert_allclose(y, Mlp(0).reference(x)["y"], rtol=1e-5, atol=1e-5)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(16)))
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("mlp")["model_stats"][0]
    assert int(stats["inference_count"]) == 64
    assert int(stats["inference_stats"]["success"]["count"]) == 64
    # Every request's queue and compute time is counted, not a sample.
    assert int(stats["inference_stats"]["queue"]["count"]) == 64
    assert int(stats["inference_stats"]["compute_infer"]["count"]) == 64
    # Requests from several connections shared device batches.
    assert int(stats["execution_count"]) < 64
    assert any(int(b["batch_size"]) > 1 for b in stats["batch_stats"])


def test_statistics_over_grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("x", [2, 16], "FP32")
    inp.set_data_from_numpy(rows(2))
    client.infer("mlp", [inp])
    stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert stats["name"] == "mlp" and stats["version"] == "1"
    assert int(stats["inference_count"]) == 2
    assert int(stats["inference_stats"]["success"]["count"]) == 1
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert [s["name"] for s in everything] == ["mlp"]
