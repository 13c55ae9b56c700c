"""The stages' import graph: code generation and the runtime (compiler driver,
cache, loader) never import each other; errors and the typed sources they
exchange live in neutral modules, and only ``disc_tf.backends`` joins them."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "disc_tf"


def _imports(folder: str) -> dict[str, set[str]]:
    """Module file -> disc_tf modules it imports (at any level of the file)."""
    out = {}
    for path in sorted((PACKAGE / folder).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        out[path.name] = {n for n in names if n.startswith("disc_tf")}
    return out


@pytest.mark.parametrize("folder,forbidden", [("codegen", "disc_tf.runtime"),
                                              ("runtime", "disc_tf.codegen")])
def test_codegen_and_runtime_do_not_import_each_other(folder, forbidden):
    bad = {f: sorted(n for n in names if n.startswith(forbidden))
           for f, names in _imports(folder).items()}
    assert not {f: n for f, n in bad.items() if n}, bad


def test_nothing_above_the_backends_branches_on_the_target():
    for path in [PACKAGE / "pipeline.py", PACKAGE / "optimizer.py", PACKAGE / "saved_model.py"]:
        text = path.read_text()
        assert 'target == "cuda"' not in text and 'target == "cpu"' not in text, path


#: Longest module of the compiler's middle and back end (issue: one class of 900
#: lines mixing alias analysis, placement and memory planning).
MAX_MODULE_LINES = 600


@pytest.mark.parametrize("folder", ["fusion", "codegen"])
def test_modules_stay_small(folder):
    long = {p.name: n for p in (PACKAGE / folder).glob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules: {long}"


def test_the_planner_is_in_parts_that_do_not_reach_back():
    """Alias analysis and memory planning never depend on placement."""
    imports = _imports("fusion")
    for part in ("value_access.py", "memory_plan.py", "symbols.py"):
        assert not {n for n in imports[part]
                    if n.startswith(("disc_tf.fusion.planner", "disc_tf.fusion.place_data"))}, part
