"""Sizes a reader can hold, checked over every module of the project's packages, subpackages
included (benchmarks/ and tests/ are not checked):

- no function or method longer than 80 lines (``def`` line to last line, decorators excluded);
- no module longer than 600 lines, except the modules in ``MODULE_CEILINGS``, each held at most
  at its listed line count: a ratchet that lets them shrink, never grow.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("graphs", "training", "assets", "pipelines")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600

# Modules over MAX_MODULE_LINES, each with the line count it may not exceed (lower a ceiling
# when its module shrinks); an entry is refused once its module is at most MAX_MODULE_LINES.
MODULE_CEILINGS: dict[str, int] = {}


def _modules() -> list[Path]:
    """Every module of the checked packages, subpackages included."""
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function or method in `source` longer than `limit` lines."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > limit
    ]


def module_size_problems(sizes: dict[str, int], ceilings: dict[str, int], limit: int = MAX_MODULE_LINES) -> list[str]:
    """What is wrong with the module line counts `sizes` against `limit` and the ratchet `ceilings`."""
    problems = []
    for name, lines in sorted(sizes.items()):
        ceiling = ceilings.get(name)
        if ceiling is None and lines > limit:
            problems.append(f"{name}: {lines} lines, over {limit}; split it along what its parts do")
        elif ceiling is not None and lines > ceiling:
            problems.append(f"{name}: {lines} lines, over its ceiling of {ceiling} in MODULE_CEILINGS; shrink it")
        elif ceiling is not None and lines <= limit:
            problems.append(f"{name}: {lines} lines, now at most {limit}; remove it from MODULE_CEILINGS")
    problems += [
        f"{name}: in MODULE_CEILINGS but not a module; remove it" for name in sorted(set(ceilings) - set(sizes))
    ]
    return problems


def test_no_function_is_over_80_lines():
    offenders = [
        f"{_name(path)}:{line} {name} has {length} lines"
        for path in _modules()
        for name, line, length in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, (
        f"functions over {MAX_FUNCTION_LINES} lines (split each along the steps a reader follows):\n"
        + "\n".join(offenders)
    )


def test_no_module_is_over_600_lines_or_its_ceiling():
    sizes = {_name(path): len(path.read_text(encoding="utf-8").splitlines()) for path in _modules()}
    problems = module_size_problems(sizes, MODULE_CEILINGS)
    assert not problems, "module sizes:\n" + "\n".join(problems)


def test_function_length_counts_def_to_last_line_without_decorators():
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    source = f"@decorator\n@another(1)\ndef f():\n{body}\n    return x0\n\n\nclass C:\n    def g(self):\n        pass\n"
    assert long_functions(source, limit=80) == [("f", 3, 81)]
    assert long_functions(source, limit=81) == []
    nested = "def outer():\n    def inner():\n" + "\n".join(f"        y{i} = {i}" for i in range(5)) + "\n"
    assert long_functions(nested, limit=5) == [("outer", 1, 7), ("inner", 2, 6)]


def test_module_ratchet_names_each_problem_and_what_to_do():
    sizes = {"a.py": 601, "b.py": 700, "c.py": 650, "d.py": 599, "e.py": 600}
    ceilings = {"b.py": 690, "c.py": 660, "d.py": 620, "gone.py": 900}
    assert module_size_problems(sizes, ceilings, limit=600) == [
        "a.py: 601 lines, over 600; split it along what its parts do",
        "b.py: 700 lines, over its ceiling of 690 in MODULE_CEILINGS; shrink it",
        "d.py: 599 lines, now at most 600; remove it from MODULE_CEILINGS",
        "gone.py: in MODULE_CEILINGS but not a module; remove it",
    ]
