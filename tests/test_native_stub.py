"""The extension's .pyi stub names exactly what the module exports, so type checkers stay true."""

import ast
import inspect
from pathlib import Path

import fastload
from fastload import _native

STUB = Path(fastload.__file__).with_name("_native.pyi")


def stub_names() -> tuple[set[str], dict[str, set[str]]]:
    tree = ast.parse(STUB.read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            top.add(node.name)
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return top, classes


def public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stub_lists_every_module_name():
    top, classes = stub_names()
    assert public(_native) == top
    for name, methods in classes.items():
        cls = getattr(_native, name)
        assert inspect.isclass(cls)
        members = {n for n in dir(cls) if not n.startswith("_") or n in ("__init__", "__len__")}
        own = {n for n in members if n in cls.__dict__}
        assert own - {"__init__"} == methods - {"__init__"}, name
