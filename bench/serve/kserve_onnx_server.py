"""The baseline of bench/serve/serve_bench.py: KServe's Python model server
(the `kserve` package) serving an ONNX model with onnxruntime inside, over
the same v2 protocol on HTTP and gRPC.

    kserve_onnx_server.py MODEL.onnx --name NAME --http-port P --grpc-port Q [--threads T]

KServe's server has no model-configuration endpoint (a Triton extension);
perf_analyzer asks it once before it starts, so this adds a read-only
`GET /v2/models/NAME/config` describing the model, which no inference
request touches. (Its gRPC service has no ModelConfig method either, so
perf_analyzer can drive it over HTTP only.)"""

import argparse

import numpy as np
import onnxruntime as ort
import kserve
import kserve.model_server
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

ORT_TO_CONFIG = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64", "tensor(int32)": "TYPE_INT32"}
ORT_TO_V2 = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32"}


class OnnxModel(Model):
    def __init__(self, name, path, threads):
        super().__init__(name)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.ready = True

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        feeds = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        names = [o.name for o in self.session.get_outputs()]
        results = self.session.run(names, feeds)
        outputs = []
        for name, value in zip(names, results):
            output = InferOutput(name=name, shape=list(value.shape), datatype=ORT_TO_V2[
                next(o.type for o in self.session.get_outputs() if o.name == name)])
            output.set_data_from_numpy(np.ascontiguousarray(value), binary_data=True)
            outputs.append(output)
        # Binary outputs where the request asks for them (perf_analyzer does).
        return InferResponse(model_name=self.name, infer_outputs=outputs, response_id=payload.id or "",
                             use_binary_outputs=payload.use_binary_outputs, requested_outputs=payload.request_outputs)

    def get_input_types(self):
        return [{"name": i.name, "datatype": ORT_TO_V2[i.type],
                 "shape": [d if isinstance(d, int) else -1 for d in i.shape]} for i in self.session.get_inputs()]

    def get_output_types(self):
        return [{"name": o.name, "datatype": ORT_TO_V2[o.type],
                 "shape": [d if isinstance(d, int) else -1 for d in o.shape]} for o in self.session.get_outputs()]

    def config(self):
        def dims(shape):
            return [d if isinstance(d, int) else -1 for d in shape[1:]]
        return {"name": self.name, "platform": "onnxruntime_onnx", "max_batch_size": 64,
                "input": [{"name": i.name, "data_type": ORT_TO_CONFIG[i.type], "dims": dims(i.shape)}
                          for i in self.session.get_inputs()],
                "output": [{"name": o.name, "data_type": ORT_TO_CONFIG[o.type], "dims": dims(o.shape)}
                           for o in self.session.get_outputs()]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--name", required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = OnnxModel(args.name, args.model, args.threads)
    # The configuration route, on KServe's own FastAPI application.
    kserve.model_server.app.add_api_route(f"/v2/models/{args.name}/config", model.config, methods=["GET"])
    ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, enable_docs_url=False).start([model])


if __name__ == "__main__":
    main()
