// The compiled half of kiln.Session (python/kiln/session.py): kiln's
// HostSession (include/kiln/host_session.h) for Python. The Python half
// checks names, shapes and dtypes with numpy's terms; sizes are checked
// again here, because a wrong size would corrupt memory.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "kiln/error.h"
#include "kiln/host_session.h"
#include "kiln/package_reader.h"

namespace nb = nanobind;

namespace {

using ConstArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using Array = nb::ndarray<nb::c_contig, nb::device::cpu>;

nb::list anchors(const std::vector<kiln::Anchor>& list) {
  nb::list result;
  for (const kiln::Anchor& anchor : list) {
    result.append(nb::make_tuple(anchor.name, anchor.info.shape, std::string(kiln::dtypeName(anchor.info.dtype))));
  }
  return result;
}

// Copies of tensors' bytes, as flat uint8 arrays that Python views with the
// tensor's dtype and shape.
nb::list copies(const std::vector<std::span<const std::byte>>& tensors) {
  nb::list result;
  for (const std::span<const std::byte> bytes : tensors) {
    auto* data = new std::byte[std::max<size_t>(bytes.size(), 1)];
    if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<std::byte*>(p); });
    result.append(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(data, {bytes.size()}, owner));
  }
  return result;
}

}  // namespace

void bindHostSession(nb::module_& m) {
  nb::class_<kiln::HostSession>(m, "HostSession")
      .def(
          "__init__",
          [](kiln::HostSession* self, const std::string& path, const std::string& model, const std::string& device,
             uint32_t replication_factor, uint32_t num_host_transfers) {
            kiln::HostSessionOptions options;
            options.model = model;
            options.device = device;
            options.replication_factor = replication_factor;
            options.num_host_transfers = num_host_transfers;
            new (self) kiln::HostSession(std::make_shared<kiln::PackageReader>(std::filesystem::path(path)), options);
          },
          nb::arg("path"), nb::arg("model"), nb::arg("device"), nb::arg("replication_factor"),
          nb::arg("num_host_transfers"))
      .def_prop_ro("inputs", [](const kiln::HostSession& s) { return anchors(s.inputs()); })
      .def_prop_ro("outputs", [](const kiln::HostSession& s) { return anchors(s.outputs()); })
      .def_prop_ro("variables", [](const kiln::HostSession& s) { return anchors(s.variables()); })
      .def_prop_ro("constants", [](const kiln::HostSession& s) { return anchors(s.constants()); })
      .def_prop_ro("is_attached", &kiln::HostSession::isAttached)
      .def_prop_ro("weights_to_host_count", &kiln::HostSession::weightsToHostCount)
      .def_prop_ro("weights_from_host_count", &kiln::HostSession::weightsFromHostCount)
      .def_prop_ro("main_runs", &kiln::HostSession::mainRuns)
      .def("attach", [](kiln::HostSession& s) { nb::gil_scoped_release release; return s.attach(); })
      .def("detach", [](kiln::HostSession& s) { nb::gil_scoped_release release; return s.detach(); })
      .def("weights_to_host", [](kiln::HostSession& s) { nb::gil_scoped_release release; s.weightsToHost(); })
      .def("weights_from_host", [](kiln::HostSession& s) { nb::gil_scoped_release release; s.weightsFromHost(); })
      .def(
          "run",
          [](kiln::HostSession& s, const std::vector<std::string>& input_names, const std::vector<ConstArray>& inputs,
             const std::vector<std::string>& output_names, const std::vector<Array>& outputs) {
            if (input_names.size() != inputs.size() || output_names.size() != outputs.size()) {
              throw kiln::UsageError("run: one name per array");
            }
            kiln::InputMemoryView in;
            for (size_t i = 0; i < inputs.size(); ++i) in[input_names[i]] = {inputs[i].data(), inputs[i].nbytes()};
            kiln::OutputMemoryView out;
            for (size_t i = 0; i < outputs.size(); ++i) out[output_names[i]] = {outputs[i].data(), outputs[i].nbytes()};
            nb::gil_scoped_release release;
            s.run(in, out);
          },
          nb::arg("input_names"), nb::arg("inputs"), nb::arg("output_names"), nb::arg("outputs"))
      .def(
          "read_tensors",
          [](kiln::HostSession& s, const std::vector<std::string>& names) {
            std::vector<std::span<const std::byte>> tensors;
            {
              nb::gil_scoped_release release;
              tensors = s.readTensors(names);
            }
            return copies(tensors);
          },
          nb::arg("names"))
      .def(
          "write_variables",
          [](kiln::HostSession& s, const std::vector<std::string>& names, const std::vector<ConstArray>& arrays) {
            if (names.size() != arrays.size()) throw kiln::UsageError("write_variables: one name per array");
            std::vector<std::pair<std::string, std::span<const std::byte>>> values;
            for (size_t i = 0; i < names.size(); ++i) {
              values.emplace_back(names[i], std::span(static_cast<const std::byte*>(arrays[i].data()), arrays[i].nbytes()));
            }
            nb::gil_scoped_release release;
            s.writeVariables(values);
          },
          nb::arg("names"), nb::arg("arrays"));
}
