#include "specialize/host_loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kiln/error.h"

namespace kiln {
namespace {

int64_t readTripCount(const TensorRef& t) {
  if (t.info.dtype != DType::kI64 || t.info.numElements() != 1) {
    throw UsageError(fmt::format("Loop: the trip count must be one i64, got {}", t.info.toString()));
  }
  int64_t value;
  std::memcpy(&value, t.data, sizeof value);
  return value;
}

bool readCondition(const TensorRef& t, const char* what) {
  if (t.info.dtype != DType::kBool || t.info.numElements() != 1) {
    throw UsageError(fmt::format("Loop: {} must be one bool, got {}", what, t.info.toString()));
  }
  return std::to_integer<uint8_t>(t.data[0]) != 0;
}

void assign(HostTensor& to, const TensorInfo& info, const std::byte* data) {
  to.info = info;
  to.bytes.assign(data, data + info.sizeInBytes());
}

// A declared scalar input ([] or [1], or not fixed) as the body reads it.
TensorInfo scalarOf(TensorInfo declared, DType dtype) {
  declared.dtype = dtype;
  if (!declared.isStatic() || declared.numElements() != 1) declared.shape.clear();
  return declared;
}

}  // namespace

void runHostLoop(const HostLoopSpec& spec, const TensorRef* trip_count, const TensorRef* condition,
                 std::span<const TensorRef> initial, std::span<const TensorRef> captures, const BodyCall& body,
                 std::vector<HostTensor>& outputs) {
  const size_t carried = spec.unchanged.size();
  if (initial.size() != carried) {
    throw UsageError(fmt::format("Loop: {} initial values for {} carried values", initial.size(), carried));
  }
  const int64_t limit = trip_count != nullptr ? readTripCount(*trip_count) : std::numeric_limits<int64_t>::max();
  bool keep_going = condition != nullptr ? readCondition(*condition, "the condition") : true;

  std::vector<HostTensor> now(carried), next(carried), scans(spec.scans.size());
  for (size_t k = 0; k < carried; ++k) assign(now[k], initial[k].info, initial[k].data);
  // Each scan output's shape in one iteration: from the first one (with no
  // iteration at all, as declared).
  std::vector<TensorInfo> step_shapes = spec.scans;
  const TensorInfo iteration_info = scalarOf(spec.iteration_info, DType::kI64);
  const TensorInfo condition_info = scalarOf(spec.condition_info, DType::kBool);

  std::vector<TensorInfo> infos;
  std::vector<const std::byte*> data;
  HostTensor condition_out;
  int64_t iteration = 0;
  for (; iteration < limit && keep_going; ++iteration) {
    const auto flag = static_cast<std::byte>(keep_going ? 1 : 0);
    infos.assign({iteration_info, condition_info});
    data.assign({reinterpret_cast<const std::byte*>(&iteration), &flag});
    for (const HostTensor& value : now) {
      infos.push_back(value.info);
      data.push_back(value.bytes.data());
    }
    for (const TensorRef& capture : captures) {
      infos.push_back(capture.info);
      data.push_back(capture.data);
    }
    const OutputAllocator allocate = [&](size_t index, const TensorInfo& info) -> std::byte* {
      const size_t output = spec.body_outputs.at(index);
      HostTensor* target = &condition_out;
      if (output >= 1 && output <= carried) {
        target = &next[output - 1];
      } else if (output > carried) {
        const size_t scan = output - 1 - carried;
        if (iteration == 0) step_shapes[scan] = info;
        if (info != step_shapes[scan]) {
          throw UsageError(fmt::format("Loop: scan output {} is {} in iteration {} but {} in the first", scan,
                                       info.toString(), iteration, step_shapes[scan].toString()));
        }
        std::vector<std::byte>& bytes = scans[scan].bytes;
        const size_t at = bytes.size();
        bytes.resize(at + info.sizeInBytes());
        return bytes.data() + at;
      }
      target->info = info;
      target->bytes.resize(std::max<size_t>(info.sizeInBytes(), 1));
      return target->bytes.data();
    };
    body(infos, data, allocate);
    keep_going = readCondition({condition_out.info, condition_out.bytes.data()}, "the body's condition output");
    for (size_t k = 0; k < carried; ++k) {
      if (!spec.unchanged[k]) std::swap(now[k], next[k]);
    }
  }

  outputs.clear();
  for (HostTensor& value : now) outputs.push_back(std::move(value));
  for (size_t j = 0; j < scans.size(); ++j) {
    HostTensor& scan = scans[j];
    if (!step_shapes[j].isStatic()) step_shapes[j].shape.clear();  // no iteration, and no declared shape
    scan.info.dtype = step_shapes[j].dtype;
    scan.info.shape = {iteration};
    scan.info.shape.insert(scan.info.shape.end(), step_shapes[j].shape.begin(), step_shapes[j].shape.end());
    outputs.push_back(std::move(scan));
  }
}

}  // namespace kiln
