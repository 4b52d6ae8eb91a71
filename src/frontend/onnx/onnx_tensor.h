// ONNX TensorProto -> kiln Constant: raw data, typed fields and external
// data files, with every size checked.
#pragma once

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <string>

#include "kiln/graph.h"

namespace kiln::onnx_import {

// Where the model came from: named in errors, and the directory external
// data files are read from (empty: external data is refused).
struct ModelSource {
  std::string name;
  std::filesystem::path base_directory;
  // The directory of the model file with symlinks resolved (empty for
  // in-memory models): external data may resolve inside either directory
  // (a Hugging Face cache links both the model and its data into blobs/).
  std::filesystem::path resolved_directory;
};

// The kiln DType of an ONNX data type code; throws GraphError naming `what`
// for types kiln does not store (string, complex).
DType dtypeFromOnnx(int32_t onnx_type, const ModelSource& source, const std::string& what);

ConstantPtr constantFromTensorProto(const onnx::TensorProto& tensor, const ModelSource& source);

}  // namespace kiln::onnx_import
