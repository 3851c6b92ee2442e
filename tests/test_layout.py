"""The shape of the code (docs/architecture.md), checked over every module of the project's
packages, subpackages included:

- graphs/ and training/ never import Dagster, assets/ or pipelines/; graphs/ never imports
  training/; training/ never imports DGL at module level (it must run where DGL cannot be
  installed);
- no import cycle between project modules: none through module-level imports anywhere, and
  in graphs/, training/ and assets/ none even through imports inside functions;
- no private name (leading underscore) imported from another project module, except by a
  package's ``__init__`` from its own submodules;
- imports at module top: an import of a project module inside a function carries a comment on
  its line saying why it is there (a measured start-up cost, a cycle, a heavy dependency);
- no ``unittest.mock`` outside tests/;
- every module of graphs/ lives in one of its rooms (`GRAPHS_ROOMS`), and the lower rooms never
  import the higher ones: infra/ imports only infra/; kernels/ only infra/, kernels/ and
  formats/;
- no variant switch: no comparison of a sampler or layer name (``.sampler``, ``.conv``) with a
  literal name anywhere; what a sampler or a layer is, every check reads from its declared
  traits (`graphs.sampling.registry`, `training.layer_registry`; docs/extending.md).
"""

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("graphs", "training", "assets", "pipelines")
LIBRARIES = ("graphs", "training", "assets")  # no cycle even through imports inside functions


def _files(package: str) -> list[Path]:
    """Every module of `package`, subpackages included."""
    return sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in PACKAGES for p in _files(package)}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_nodes(tree: ast.Module, top_level_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module; with `top_level_only`, those run when it is imported
    (not inside a function, not under ``if TYPE_CHECKING``)."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not top_level_only or not (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or _is_type_checking(node)
        ):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name a ``from ... import`` reads from (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """Top-level package names `path` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in _import_nodes(tree, top_level_only):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _project_imports(path: Path, top_level_only: bool) -> list[tuple[str, str, ast.ImportFrom | ast.Import]]:
    """(project module imported, name imported from it or "", statement) for every import of a
    project module in `path`; ``from pkg import submodule`` counts as importing the submodule."""
    module = _module_name(path)
    out = []
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path)), top_level_only):
        if isinstance(node, ast.Import):
            out += [(alias.name, "", node) for alias in node.names if alias.name in MODULES]
            continue
        source = _absolute(module, path, node)
        for alias in node.names:
            if f"{source}.{alias.name}" in MODULES:
                out.append((f"{source}.{alias.name}", "", node))
            elif source in MODULES:
                out.append((source, alias.name, node))
    return out


def _cycles(top_level_only: bool) -> list[list[str]]:
    """Strongly connected groups of more than one project module in the import graph (Tarjan)."""
    graph = {
        m: sorted({target for target, _, _ in _project_imports(p, top_level_only)} - {m}) for m, p in MODULES.items()
    }
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_every_subpackage_is_walked():
    walked = {str(p.relative_to(ROOT)) for package in PACKAGES for p in _files(package)}
    assert {"graphs/sampling/kinds/saint.py", "graphs/sampling/__init__.py", "training/train.py"} <= walked
    assert MODULES["graphs.sampling"] == ROOT / "graphs" / "sampling" / "__init__.py"


@pytest.mark.parametrize("package", ["graphs", "training"])
def test_library_packages_never_import_dagster_or_assets(package):
    for path in _files(package):
        found = _imports(path, top_level_only=False)
        assert not found & {"dagster", "assets", "pipelines"}, (
            f"{path.relative_to(ROOT)} imports {found & {'dagster', 'assets', 'pipelines'}}"
        )


def test_training_imports_dgl_only_lazily():
    for path in _files("training"):
        assert "dgl" not in _imports(path, top_level_only=True), f"{path.relative_to(ROOT)} imports dgl at module level"


# graphs/'s rooms (docs/architecture.md): what a module is, lowest first
GRAPHS_ROOMS = ("infra", "kernels", "formats", "stages", "sampling", "synthetic")
ROOM_MAY_IMPORT = {"infra": {"infra"}, "kernels": {"infra", "kernels", "formats"}}


def test_every_graphs_module_lives_in_a_room():
    loose = [m for m in MODULES if m.startswith("graphs.") and m.split(".")[1] not in GRAPHS_ROOMS]
    assert not loose, f"move these into one of graphs/{GRAPHS_ROOMS}: {loose}"
    rooms = {p.name for p in (ROOT / "graphs").iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(GRAPHS_ROOMS)


def test_lower_rooms_of_graphs_never_import_higher_ones():
    offenders = [
        f"{module} imports {target}"
        for module, path in MODULES.items()
        if module.startswith("graphs.") and module.split(".")[1] in ROOM_MAY_IMPORT
        for target, _, _ in _project_imports(path, top_level_only=False)
        if target.startswith("graphs.") and target.split(".")[1] not in ROOM_MAY_IMPORT[module.split(".")[1]]
    ]
    assert not offenders, offenders


def test_graphs_does_not_import_training():
    for path in _files("graphs"):
        assert "training" not in _imports(path, top_level_only=False), path.relative_to(ROOT)


def test_no_import_cycle_through_module_level_imports():
    assert _cycles(top_level_only=True) == []


def test_no_import_cycle_in_the_library_packages_even_through_imports_in_functions():
    in_libraries = [g for g in _cycles(top_level_only=False) if any(m.split(".")[0] in LIBRARIES for m in g)]
    assert in_libraries == []


def test_no_private_name_is_imported_from_another_module():
    found = []
    for module, path in MODULES.items():
        for source, name, node in _project_imports(path, top_level_only=False):
            own_submodule = path.name == "__init__.py" and source.startswith(f"{module}.")
            if name.startswith("_") and not name.startswith("__") and not own_submodule:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name} from {source}")
    assert found == []


def _uncommented_imports_in_functions(source: str) -> list[int]:
    """Lines of the imports of a project module (relative ones included) inside a function of
    `source` with no comment on any line of the statement."""
    commented = {
        tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    }
    lines = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import):
                project = any(alias.name.split(".")[0] in PACKAGES for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                project = node.level > 0 or (node.module or "").split(".")[0] in PACKAGES
            else:
                continue
            if project and not commented & set(range(node.lineno, node.end_lineno + 1)):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_every_import_in_a_function_says_why():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in MODULES.values()
        if (lines := _uncommented_imports_in_functions(p.read_text()))
    }
    assert found == {}, "move these imports to the module top, or say on their line why not (e.g. '# lazy: ...')"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f():\n    from graphs.stages import compress\n", [2]),
        ("def f():\n    import training.link\n", [2]),
        ("def f():\n    import os, assets\n", [2]),
        ("def f():\n    from . import writer\n", [2]),
        ("def f():\n    from .writer import write\n", [2]),
        ("class C:\n    async def f(self):\n        if x:\n            from pipelines.cli import main\n", [4]),
        ("def f():\n    def g():\n        from graphs import x\n", [3]),
        ("def f():\n    from graphs.kernels.bloom import BloomFilter  # lazy: numba, ~0.14 s\n", []),
        ("def f():\n    from graphs.x import (  # lazy: cycle\n        a,\n    )\n", []),
        ("def f():\n    import numpy\n", []),
        ("def f():\n    from graphsx import y\n", []),
        ("from graphs.stages import compress\n", []),
    ],
)
def test_the_import_comment_rule_sees_each_spelling(source, expected):
    assert _uncommented_imports_in_functions(source) == expected


def _uses_mock(tree: ast.Module) -> list[int]:
    """Lines that import ``unittest.mock`` / ``mock`` or reach ``unittest.mock`` as an attribute."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hit = any(a.name in ("mock", "unittest.mock") or a.name.startswith("unittest.mock.") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            hit = module in ("mock", "unittest.mock") or module.startswith(("mock.", "unittest.mock."))
            hit = hit or (module == "unittest" and any(a.name == "mock" for a in node.names))
        else:
            hit = isinstance(node, ast.Attribute) and node.attr == "mock" and ast.unparse(node.value) == "unittest"
        if hit:
            lines.append(node.lineno)
    return lines


def test_no_unittest_mock_outside_tests():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in MODULES.values()
        if (lines := _uses_mock(ast.parse(p.read_text(), filename=str(p))))
    }
    assert found == {}


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from unittest import mock\n", [1]),
        ("import unittest.mock\n", [1]),
        ("from unittest.mock import patch\n", [1]),
        ("import unittest\nunittest.mock.patch('x')\n", [2]),
        ("import unittest\n", []),
    ],
)
def test_the_mock_rule_sees_each_spelling(source, expected):
    assert _uses_mock(ast.parse(source)) == expected


VARIANT_FIELDS = ("sampler", "conv", "placement", "task")


def _variant_switches(tree: ast.AST) -> list[int]:
    """Lines comparing ``<x>.sampler`` / ``<x>.conv`` (a name ``sampler`` / ``conv``, or
    ``<x>["sampler"]`` / ``<x>["conv"]``) with a string literal or a tuple of them: a dispatch on
    a variant's name."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(
            (isinstance(n, ast.Attribute) and n.attr in VARIANT_FIELDS)
            or (isinstance(n, ast.Name) and n.id in VARIANT_FIELDS)
            or (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value in VARIANT_FIELDS)
            for n in sides
        )
        literal = any(
            (isinstance(n, ast.Constant) and isinstance(n.value, str))
            or (isinstance(n, (ast.Tuple, ast.List, ast.Set)) and any(isinstance(e, ast.Constant) for e in n.elts))
            for n in sides
        )
        if named and literal:
            lines.append(node.lineno)
    return lines


def test_no_code_switches_on_a_sampler_or_layer_name():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in MODULES.values()
        if (lines := _variant_switches(ast.parse(p.read_text(), filename=str(p))))
    }
    assert found == {}, "read the declared traits (docs/extending.md) instead of comparing names"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("if cfg.sampler == 'saint': pass\n", [1]),
        ("if self.conv in ('gin', 'gcn'): pass\n", [1]),
        ("x = conv != 'gat'\n", [1]),
        ("ok = manifest['sampler'] in ('neighbor', 'importance')\n", [1]),
        ("if kind.traits.seeds: pass\n", []),
        ("if cfg.sampler != NeighborSampler.name: pass\n", []),
        ("if cfg.placement == 'partition': pass\n", [1]),
        ("if manifest.task != 'link_prediction': pass\n", [1]),
    ],
)
def test_the_variant_rule_sees_each_spelling(source, expected):
    assert _variant_switches(ast.parse(source)) == expected
