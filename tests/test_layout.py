"""The house rules that keep the code readable: small modules, imports that flow one way, no dead code,
config files that state only what differs from the schema; scripts/ under the same size rules."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

import transformer_mt as tmt
from tests.conftest import ROOT, require
from transformer_mt.config import SCHEMAS

PACKAGE = ROOT / "transformer_mt"
SCRIPTS = ROOT / "scripts"
JOBS = {"transformer_mt.jobs.train", "transformer_mt.jobs.evaluate", "transformer_mt.jobs.translate",
        "transformer_mt.jobs.export", "transformer_mt.jobs.serve", "transformer_mt.jobs.score"}
TOP = {"transformer_mt", "transformer_mt.cli", "transformer_mt.jobs.composition", "transformer_mt.__main__"}
LONG_FUNCTIONS: set[str] = set()  # none today; a function named here must say why in its docstring


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path) -> set[str]:
    """The transformer_mt modules a module imports at run time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    modules = _modules()
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:  # `from a import b`: module a.b, or a
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                          else node.module)
    return {name for name in found if name in modules}


def _sources() -> dict[str, Path]:
    """The package's modules and the Python files of scripts/."""
    return {**_modules(), **{f"scripts/{p.name}": p for p in sorted(SCRIPTS.glob("*.py"))}}


def test_modules_and_functions_are_small() -> None:
    for name, path in _sources().items():
        source = path.read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 400, f"{name} has {len(source.splitlines())} lines"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name not in LONG_FUNCTIONS:
                length = node.end_lineno - node.lineno + 1
                assert length <= 80, f"{name}.{node.name} has {length} lines"


def test_imports_flow_one_way() -> None:
    """cli → jobs → building blocks → config; the model imports only torch; no job imports another."""
    graph = {name: _imports(path) - {name} for name, path in _modules().items()}
    for name, imported in graph.items():
        if name.startswith("transformer_mt.model"):
            assert imported <= {"transformer_mt.model", "transformer_mt.model.attention",
                                "transformer_mt.model.dropout", "transformer_mt.model.transformer",
                                "transformer_mt.model.ensemble"}, name
        if name in JOBS:
            assert not imported & (JOBS | TOP), f"{name} imports {imported & (JOBS | TOP)}"
        elif name not in TOP and name != "transformer_mt.jobs":
            assert not imported & (JOBS | TOP), f"the building block {name} imports {imported & (JOBS | TOP)}"
    rules = {"transformer_mt.errors", "transformer_mt.config.arguments", "transformer_mt.config.problems",
             "transformer_mt.config.dataset_checks"}  # what the value rules may import: each other
    for name in (*rules, "transformer_mt.config.checks"):
        assert graph[name] <= rules, name
    assert not graph["transformer_mt.config.arguments"], "the argument rules import nothing of the package"
    # No cycles: every module can be placed after everything it imports.
    placed: set[str] = set()
    while len(placed) < len(graph):
        ready = {n for n, deps in graph.items() if n not in placed and deps <= placed | {n}}
        assert ready, f"an import cycle among {sorted(set(graph) - placed)}"
        placed |= ready


def _drawn_layers() -> dict[str, set[str]]:
    """docs/architecture.md's layer table: each package's layer and the layers it may import."""
    table = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("## One line per module")[0]
    layers = {}
    words = {"every", "layer", "below", "torch", "only", "errors", "py"}  # not layers
    for name, imports in re.findall(r"^\| \*\*(\w+)/\*\* \|[^|]*\| ([^|]*) \|$", table, re.MULTILINE):
        layers[name] = set(re.findall(r"[a-z]+", imports)) - words
    return layers


def test_each_layer_imports_only_those_drawn_below_it() -> None:
    """As docs/architecture.md draws the layers: a module imports its own package's modules, the layers
    its row names (jobs: every layer below), errors.py and tables.py, and nothing else of the package."""
    layers = _drawn_layers()
    order = list(layers)  # from the top down, as the table lists them
    assert {"jobs", "config", "checkpoints", "data"} <= set(order), order
    for name, path in _modules().items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in layers:
            continue
        layer = parts[1]
        allowed = set(order[order.index(layer) + 1:]) if layer == "jobs" else layers[layer]
        for imported in _imports(path):
            target = imported.split(".")[1] if "." in imported else ""
            if target in ("", layer, "errors", "tables"):
                continue
            assert target in allowed, f"{name} imports {imported}: {layer} imports only {sorted(allowed)}"


# The entry points, and two modules every layer uses (docs/architecture.md says why)
TOP_LEVEL = {"__init__.py", "__main__.py", "cli.py", "errors.py", "tables.py"}


def test_the_package_is_in_layers() -> None:
    """Only the entry points, and the two modules every layer uses (justified in docs/architecture.md),
    sit at the top; no two modules, and no two classes, share a name: each name shows one place."""
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    modules = Counter(p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert not [name for name, n in modules.items() if n > 1], "modules share a name"
    classes = Counter(node.name for path in PACKAGE.rglob("*.py")
                      for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                      if isinstance(node, ast.ClassDef))
    assert not [name for name, n in classes.items() if n > 1], "classes share a name"


def test_no_packed_assignments() -> None:
    """`self.a, self.b, self.c, self.d = w, x, y, z` packs four statements into one line: a module is
    split, not packed (short names for a formula's terms, `d, f = c.d_model, c.d_ff`, read better)."""
    for name, path in _sources().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
                    and isinstance(node.value, ast.Tuple) and len(node.targets[0].elts) >= 4
                    and all(isinstance(e, ast.Attribute) for e in node.targets[0].elts)):
                raise AssertionError(f"{name}:{node.lineno} assigns {len(node.targets[0].elts)} at once")


def test_scripts_run_against_the_installed_package() -> None:
    """Scripts neither edit sys.path nor import from tests/: `python scripts/x.py` imports the installed
    package, and a sibling (timing.py) from the script's own directory, which Python puts on sys.path."""
    for path in sorted(SCRIPTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "path":
                assert getattr(node.value, "id", None) != "sys", f"{path.name}:{node.lineno} uses sys.path"
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            tests = [n for n in names if n.split(".")[0] == "tests"]
            assert not tests, f"{path.name}:{node.lineno} imports {tests}"


def test_one_markdown_table_writer() -> None:
    """Markdown tables come from transformer_mt/tables.py: no other module or script spells out the
    separator row of one (`|---|`, `---:`). A bare `---` is no table's: YAML's document fence."""
    separator = re.compile(r"\|\s*:?-{3,}|^:-{3,}:?$|^-{3,}:$")
    for name, path in _sources().items():
        if name == "transformer_mt.tables":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not separator.search(node.value), f"{name}:{node.lineno} writes a Markdown table"


def test_the_package_imports_without_torch() -> None:
    """`transformer-mt --help` and shell completion start fast: torch comes with the first real job."""
    code = "import sys, transformer_mt, transformer_mt.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
    assert tmt.Translator.__name__ == "Translator"  # the documented `from transformer_mt import Translator`


def test_no_dead_code() -> None:
    """Everything the package defines is used by the package or its scripts (vulture); what only a
    framework or a user calls is listed, with its reason, in tests/dead_code_whitelist.py."""
    require("vulture")
    result = subprocess.run([sys.executable, "-m", "vulture", "transformer_mt", "scripts",
                             "tests/dead_code_whitelist.py", "--min-confidence", "60"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.stdout == "", result.stdout


def _flat(node: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}


def _option_files() -> list[Path]:
    return sorted(p for p in (ROOT / "configs").glob("*/*.yaml") if p.parent.name not in ("hydra", "sweep"))


@pytest.mark.parametrize("path", _option_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_config_files_state_only_what_differs(path: Path) -> None:
    """Every value a config file sets differs from what the config would be without the file: a group
    option from the schema's section, a recipe (experiment, debug) from the groups it selects."""
    text = path.read_text(encoding="utf-8")
    body = yaml.safe_load(text) or {}
    if "# @package _global_" in text:
        groups = [f"{key.split('/')[-1]}={option}" for entry in body.pop("defaults", [])
                  for key, option in entry.items() if key.startswith("override /")]
        base = dataclasses.asdict(tmt.compose("train", groups))
    else:
        base = dataclasses.asdict(SCHEMAS["train"]())[path.parent.name]
    same = {k: v for k, v in _flat(body).items() if _flat(base).get(k) == v}
    assert not same, f"{path.relative_to(ROOT)} repeats what is already so: {same}"
