// The KServe v2 protocol's tensor datatypes ("FP32", "INT64", ...) and
// Triton's model-configuration types ("TYPE_FP32", ...) for kiln's dtypes.
#pragma once

#include <optional>
#include <string_view>

#include "kiln/dtype.h"

namespace kiln::server {

// "FP32" for kF32 ...; empty for a dtype the protocol cannot carry
// (float8, int4, ...).
std::string_view protocolDatatype(DType dtype);
// The dtype a protocol datatype names; nullopt for BYTES and unknown names.
std::optional<DType> dtypeFromProtocol(std::string_view datatype);
// "TYPE_FP32" for kF32 ...; "TYPE_INVALID" for the rest.
std::string_view configDatatype(DType dtype);
// The value of that name in the protocol's DataType enum (TYPE_FP32 = 11).
int configDatatypeNumber(DType dtype);

}  // namespace kiln::server
