"""The model repository extension: index, load, unload, and a new version
loaded while traffic runs, without one request dropped."""

import shutil
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import Mlp, add_model, compile_mlp


def infer_http(client, x, version=""):
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("mlp", [inp], model_version=version)


def test_index_load_unload(start_server, repository, mlp_package):
    add_model(repository, "second", mlp_package)
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "1" / "model.kiln").write_bytes(b"not a package")
    server = start_server(repository)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["mlp"]["state"] == "READY" and index["mlp"]["version"] == "1"
    assert index["second"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE" and "broken" in server.log()
    assert index["broken"]["reason"]
    assert not http.is_server_ready()  # a model failed to load
    ready = grpc.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in ready if m["state"] == "READY"} == {"mlp", "second"}

    http.unload_model("second")
    assert not http.is_model_ready("second")
    with pytest.raises(InferenceServerException, match="not loaded"):
        infer_http(http, np.zeros((1, 16), np.float32)) if False else http.get_model_metadata("second")
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["second"]["state"] == "UNAVAILABLE"
    grpc.load_model("second")
    assert grpc.is_model_ready("second")
    with pytest.raises(InferenceServerException, match="cannot be loaded"):
        http.load_model("broken")
    with pytest.raises(InferenceServerException, match="no model"):
        grpc.load_model("missing")
    with pytest.raises(InferenceServerException, match="not loaded"):
        grpc.unload_model("missing")
    shutil.rmtree(repository / "broken")
    assert "mlp" in {m["name"] for m in http.get_model_repository_index()}


def test_new_version_loads_without_dropping_traffic(start_server, repository, kiln_binary, tmp_path):
    server = start_server(repository)
    stop = threading.Event()
    failures, answers = [], []

    def traffic(seed):
        client = httpclient.InferenceServerClient(server.http_url)
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            x = rng.standard_normal((1, 16)).astype(np.float32)
            try:
                result = infer_http(client, x)
                answers.append((result.get_response()["model_version"], x, result.as_numpy("y")))
            except Exception as error:  # noqa: BLE001 - any failure fails the test
                failures.append(repr(error))

    threads = [threading.Thread(target=traffic, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # Version 2: other weights.
    compile_mlp(kiln_binary, repository / "mlp" / "2", Mlp(7))
    http = httpclient.InferenceServerClient(server.http_url)
    http.load_model("mlp")
    import time
    time.sleep(0.5)
    http.load_model("mlp")  # a reload of the same version, also under traffic
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join()
    assert failures == []
    versions = {version for version, _, _ in answers}
    assert versions == {"1", "2"}
    for version, x, y in answers:
        np.testing.assert_allclose(y, Mlp(0 if version == "1" else 7).reference(x)["y"], rtol=1e-5, atol=1e-5)
    assert http.get_model_metadata("mlp")["versions"] == ["2"]  # the latest policy
    assert not http.is_model_ready("mlp", "1")


def test_version_policy_all(start_server, tmp_path, mlp_package, kiln_binary):
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, version=1, config={"version_policy": "all"})
    compile_mlp(kiln_binary, repo / "mlp" / "3", Mlp(3))
    server = start_server(repo)
    http = httpclient.InferenceServerClient(server.http_url)
    assert http.get_model_metadata("mlp")["versions"] == ["1", "3"]
    x = np.ones((2, 16), np.float32)
    np.testing.assert_allclose(infer_http(http, x, "1").as_numpy("y"), Mlp(0).reference(x)["y"], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(infer_http(http, x, "3").as_numpy("y"), Mlp(3).reference(x)["y"], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(infer_http(http, x).as_numpy("y"), Mlp(3).reference(x)["y"], rtol=1e-5, atol=1e-5)
    stats = http.get_inference_statistics("mlp")["model_stats"]
    assert [s["version"] for s in stats] == ["1", "3"]


def test_bad_config_is_refused_with_its_reason(start_server, tmp_path, mlp_package):
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package, config={"max_batch_szie": 4})
    server = start_server(repo)
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    assert index[0]["state"] == "UNAVAILABLE" and "max_batch_szie" in index[0]["reason"]
