"""`kiln dump` as a user runs it: options, output, exit codes and errors."""

import json
import re

import onnx
import pytest
from onnx import TensorProto, helper

from conftest import kiln_version


def section(text: str, heading: str) -> str:
    """The lines of `text` from `heading` up to the next line indented as much or less."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start + 1:]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return "\n".join(body)


def test_all_shows_every_blob_type_and_field(kiln, example):
    result = kiln("dump", "--all", example)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for expected in ["Blobs:", "Metadata:", "Executables:", "Tensors:", "Feeds:", "Opaques:",
                     'Name: "example":', "Executable: example-add", "Device: cpu", "NumDevices: 1",
                     "Features: [avx2]", "Replication Factor: 1", "IsInference: True",
                     "memory.plan: greedy-by-size", "load: [0]", "main: [1]", "save: [2]",
                     "0: WeightsFromHost", "Is compressed: True", "Available read size:", "Count: 4",
                     "Executable: example-add", "Checksum: xxh3:", f"Producer: kiln {kiln_version()}", "Version: 1.0",
                     "TensorInfo: { dtype: F32, sizeInBytes: 8, shape [2] }", "Handle: h2d_user_input",
                     "IsPerReplica: True", "UseRemoteBuffers: False", "Repeats: 1", "BatchDim: 0",
                     "EffectiveTensorInfo:"]:
        assert expected in out, expected


def test_anchors_are_split_like_the_reference_tool(kiln, example):
    out = kiln("dump", "-a", example).stdout
    assert re.findall(r'Name: "([^"]+)"', section(out, "Inputs (User provided):")) == ["user_input"]
    assert re.findall(r'Name: "([^"]+)"', section(out, "Inputs (Package provided):")) == ["input_parameter", "images"]
    assert re.findall(r'Name: "([^"]+)"', section(out, "Outputs (User provided):")) == ["Add:0"]
    assert re.findall(r'Name: "([^"]+)"', section(out, "Outputs (Package provided):")) == ["input_parameter"]


def test_user_anchors_lists_only_what_the_user_provides(kiln, example):
    out = kiln("dump", "-u", example).stdout
    anchors = out[out.index("Anchors of"):]
    assert "Package provided" not in anchors
    assert re.findall(r'Name: "([^"]+)"', anchors) == ["user_input", "Add:0"]


def test_each_option_selects_its_section(kiln, example):
    headings = {"-m": "Metadata:", "-e": "Executables:", "-t": "Tensors:", "-f": "Feeds:", "-o": "Opaques:",
                "-a": 'Anchors of "example":'}
    for option, heading in headings.items():
        out = kiln("dump", option, example).stdout
        for other in headings.values():
            assert (other in out) == (other == heading), (option, other)


def test_json_parses_and_matches_the_example(kiln, example):
    result = kiln("dump", "--json", "--all", example)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format_version"] == "1.0"
    assert [b["type"] for b in doc["blobs"]] == ["Executable", "Metadata", "TensorData", "FeedData", "Opaque"]
    assert all(b["offset"] % 64 == 0 and b["payload_offset"] % 64 == 0 for b in doc["blobs"])
    (metadata,) = doc["metadata"]
    assert metadata["executable"] == "example-add"
    assert metadata["program_flow"] == {"load": [0], "main": [1], "save": [2]}
    assert metadata["programs"] == {"0": "WeightsFromHost", "1": "Program", "2": "WeightsToHost"}
    assert {a["name"]: a["provided_by"] for a in doc["anchors"] if a["direction"] == "input"} == {
        "user_input": "user", "input_parameter": "package", "images": "package"}
    assert doc["executables"][0]["compressed"] is True
    assert doc["executables"][0]["stored_size"] < doc["executables"][0]["raw_size"]
    assert doc["tensors"][0]["tensor_info"] == {"dtype": "f32", "shape": [2], "size_in_bytes": 8}
    assert doc["feeds"][0]["count"] == 4
    assert doc["opaques"][0]["executable"] == "example-add"


def test_several_files_form_one_model(kiln, split_example):
    program, data = split_example
    together = json.loads(kiln("dump", "--json", "-u", program, data).stdout)
    assert [a["name"] for a in together["anchors"]] == ["user_input", "Add:0"]
    assert {b["source"] for b in together["blobs"]} == {str(program), str(data)}
    alone = json.loads(kiln("dump", "--json", "-u", program).stdout)  # without the data file, the user provides it
    assert [a["name"] for a in alone["anchors"]] == ["user_input", "input_parameter", "images", "Add:0",
                                                      "input_parameter"]


def test_colour_only_when_asked(kiln, example):
    assert "\x1b[" not in kiln("dump", "--all", example).stdout
    assert "\x1b[" in kiln("dump", "--all", "-c", example).stdout


def test_help_lists_the_reference_options(kiln):
    out = kiln("dump", "--help").stdout
    for option in ["--all", "-m,--metadata", "-a,--anchors", "-u,--user-anchors", "-e,--execs", "-t,--tensors",
                   "-f,--feeds", "-o,--opaques", "-c,--color", "-v,--verbose", "-h,--help", "--json"]:
        assert option in out, option


def test_verbose_logs_what_the_reader_does(kiln, example):
    result = kiln("dump", "-v", example)
    assert result.returncode == 0
    assert "Executable 'example-add'" in result.stderr


@pytest.mark.parametrize("damage, problem", [
    (lambda b: b[:100], "truncated blob header"),
    (lambda b: b"XILN" + b[4:], "bad magic"),
    (lambda b: b[:-64], "truncated file"),
    (lambda b: b + b"\0" * 10, "truncated blob header"),
])
def test_malformed_package_exits_1_with_file_offset_and_reason(kiln, example, damage, problem):
    bad = example.with_name("bad.kiln")
    bad.write_bytes(damage(example.read_bytes()))
    result = kiln("dump", "--all", bad)
    assert result.returncode == 1
    assert result.stdout == ""
    assert re.match(rf"kiln: error: {re.escape(str(bad))}: byte \d+: .*{problem}", result.stderr), result.stderr


def test_payload_corruption_is_found_on_access_or_with_verify(kiln, example):
    data = bytearray(example.read_bytes())
    doc = json.loads(kiln("dump", "--json", "-o", example).stdout)
    opaque = doc["opaques"][0]
    data[opaque["offset"] + opaque["payload_offset"] + 3] ^= 0x20
    bad = example.with_name("bad.kiln")
    bad.write_bytes(bytes(data))
    assert kiln("dump", "--all", bad).returncode == 0  # payloads are not read to describe them
    result = kiln("dump", "--verify", bad)
    assert result.returncode == 1
    assert "payload checksum mismatch in Opaque 'kiln-example'" in result.stderr


def test_verify_checks_the_models_as_a_load_does(kiln, example, tmp_path):
    # The example package's executable is a reference-style text program,
    # not one kiln compiled: the format holds, the model could not load.
    assert kiln("dump", "--verify-format", example).returncode == 0
    result = kiln("dump", "--verify", example)
    assert result.returncode == 1
    assert "executable 'example-add'" in result.stderr and "version" in result.stderr, result.stderr
    # A package kiln compiled passes both.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "relu.onnx")
    assert kiln("compile", tmp_path / "relu.onnx", "-o", tmp_path / "relu.kiln").returncode == 0
    for flag in ("--verify", "--verify-format"):
        assert kiln("dump", flag, tmp_path / "relu.kiln").returncode == 0


def test_usage_errors_exit_2(kiln, tmp_path):
    assert kiln("dump").returncode == 2                             # no file
    assert kiln("dump", tmp_path / "missing.kiln").returncode == 2  # not a file
    assert kiln("dump", "--bogus", tmp_path).returncode == 2
    assert kiln().returncode == 2                                   # no sub-command


def test_version(kiln):
    result = kiln("--version")
    assert result.returncode == 0 and f"kiln {kiln_version()}" in result.stdout
