"""Which folder may import which (README, Architecture): no import circle, the core never imports
serving/, tools, or a particular algorithm; every policy-graph call goes through rlstack/acting.py."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"rlstack": "rlstack", "algorithms": "rlstack.algorithms", "envs": "rlstack.envs",
           "serving": "rlstack.serving"}
TOOLS = {"rlstack.train", "rlstack.serve", "rlstack.play", "rlstack.record", "rlstack.plot", "rlstack.doctor",
         "rlstack.profiling"}
"""Command-line tools: they import the core, the core does not import them."""
SERVER_CLIS = {"rlstack.serve", "rlstack.bench.serve"}
"""The only modules of rlstack/ that may import serving/ (they start a server)."""


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n.startswith("rlstack")}


def _imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports anywhere (module level, functions, TYPE_CHECKING):
    `from a import b` names the module `a.b` where there is one, else `a`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names}
    return {name for name in found if name in modules}


def test_no_import_circle_at_any_level():
    """Function-level and type-checking imports count too: a circle there is a seam in the wrong place."""
    modules = _modules()
    _no_circle({m: _imported_modules(p, modules) - {m} for m, p in modules.items()})


def test_no_import_circle_at_module_level():
    modules = _modules()
    _no_circle({m: {i for i in _imports(p, top_level_only=True) if i in modules and i != m}
                for m, p in modules.items()})


def _no_circle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}

    def visit(m: str, chain: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join([*chain[chain.index(n):], n]))
            if n not in state:
                visit(n, [*chain, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_core_imports_neither_serving_nor_tools_nor_an_algorithm():
    for name, path in _modules().items():
        if not name.startswith("rlstack.") or name.split(".")[1] in ("algorithms", "envs", "serving"):
            continue
        imported = _imports(path, top_level_only=False)
        if name not in SERVER_CLIS:
            assert not any(i.startswith("rlstack.serving") for i in imported), f"{name} imports serving/"
        if name not in TOOLS and not name.startswith("rlstack.bench"):
            assert not imported & TOOLS, f"the core module {name} imports a tool: {imported & TOOLS}"
            assert not any(i.startswith("rlstack.bench") for i in imported), f"{name} imports rlstack.bench"
            algorithms = {i for i in imported if i.startswith("rlstack.algorithms.")}
            assert not algorithms or name == "rlstack.registry", f"{name} imports {algorithms}"


def test_algorithms_envs_and_serving_import_the_core_only():
    modules = _modules()
    for name, path in modules.items():
        imported = _imports(path, top_level_only=False)
        if name.startswith(("rlstack.serving", "rlstack.envs")):
            assert not any(i.startswith("rlstack.algorithms") for i in imported), f"{name} imports an algorithm"
        if name.startswith(("rlstack.envs", "rlstack.algorithms")):
            assert not any(i.startswith("rlstack.serving") for i in imported), f"{name} imports serving/"


def test_only_the_acting_module_runs_policy_graphs():
    """Every call of a policy graph goes through `rlstack.acting.Acting` (the lean call it uses lives
    in graphcall.py): no other module wraps a GraphCell or builds its own acting class."""
    for name, path in _modules().items():
        text = path.read_text()
        if name in ("rlstack.acting", "rlstack.artifact", "rlstack.graphcall"):
            continue
        assert "GraphCell(" not in text, f"{name} builds its own nn.GraphCell"
        assert "class GraphActing" not in text and "class LivePlayer" not in text, name
