"""The type stubs of the compiled module (_kiln.pyi, written at build time by
nanobind's stubgen) and the PEP 561 marker sit next to the module."""

import ast
import pathlib

import kiln

PACKAGE = pathlib.Path(kiln.__file__).parent


def test_stubs_describe_the_compiled_module():
    assert (PACKAGE / "py.typed").is_file()
    tree = ast.parse((PACKAGE / "_kiln.pyi").read_text())
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"Executor", "DynamicExecutor", "DeviceRunner", "HostSession", "StepTrace"} <= classes, classes
    assert {"compile", "load_plugin", "is_graph_package"} <= functions, functions
    compile_stub = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "compile")
    assert compile_stub.args.args, "compile's stub lists its parameters"
