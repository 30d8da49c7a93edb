"""The tree's shape, as rules the code must keep (docs/ARCHITECTURE.md, "Layers").

Read from the source with `ast` (nothing is imported): module-level imports only, the
ones that run at import time (not under `if TYPE_CHECKING:`, not inside functions).

- dependencies point one way: edge (app, CLI, ingress, console, MCP, bench) ->
  pipeline -> stages -> concepts -> backends; backends never import the gateway;
- the benchmark and load tools are imported by nothing but the CLI;
- no module imports another module's private (underscore) names;
- no import cycles, counting imports deferred into functions too;
- a backend's package imports the shared parts of backends/, never another backend.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The layers, highest first. A module may import its own layer and those below it.
EDGE = (
    "gateway.app",
    "gateway.appkeys",
    "gateway.cli",
    "gateway.commands",
    "gateway.__main__",
    "gateway.ingress",
    "gateway.console",
    "gateway.mcp",
    "gateway.bench",
)
PIPELINE = ("gateway.pipeline",)
STAGES = ("gateway.stages",)
BACKENDS = ("backends",)
BENCH = "gateway.bench"
# Who may run the benchmark and load tools: the command line, and the tools themselves.
BENCH_USERS = ("gateway.cli", "gateway.commands", BENCH)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer(module: str) -> int:
    if _under(module, BACKENDS):
        return 0
    if _under(module, EDGE):
        return 4
    if _under(module, PIPELINE):
        return 3
    if _under(module, STAGES):
        return 2
    return 1  # a concept package, or a plain module the pipeline shares (errors, models)


def modules() -> dict[str, Path]:
    found = {}
    for root in ("gateway", "backends"):
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _import_time(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements that run when the module is imported."""
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" not in test:
                todo[:0] = [*node.body, *node.orelse]
            continue
        if isinstance(node, ast.Try):
            todo[:0] = [*node.body, *node.orelse, *node.finalbody]
            for handler in node.handlers:
                todo[:0] = handler.body
            continue
        yield node


def _everywhere(tree: ast.Module) -> Iterator[ast.AST]:
    """Every statement, function bodies included, but not `if TYPE_CHECKING:` blocks."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def imports(
    path: Path, known: dict[str, Path], deferred: bool = False
) -> Iterator[tuple[str, list[str]]]:
    """(imported module, names taken from it) for each import that runs at import, and
    with `deferred` also those inside functions."""
    tree = _parsed(path)
    for node in _everywhere(tree) if deferred else _import_time(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [a.name for a in node.names]
            subs = [n for n in names if f"{node.module}.{n}" in known]
            for sub in subs:
                yield f"{node.module}.{sub}", []
            rest = [n for n in names if n not in subs]
            if rest or not subs:
                yield node.module, rest


_TREES: dict[Path, ast.Module] = {}


def _parsed(path: Path) -> ast.Module:
    """The module's syntax tree, parsed on a fresh thread: CPython 3.11's parser keeps
    a per-thread recursion count that a RecursionError caught earlier in the same
    test process (the parsing tests provoke many) can leave off ("AST constructor
    recursion depth mismatch")."""
    if path not in _TREES:
        with ThreadPoolExecutor(max_workers=1) as pool:
            _TREES[path] = pool.submit(ast.parse, path.read_text()).result()
    return _TREES[path]


def _ours(name: str) -> bool:
    return name.split(".")[0] in ("gateway", "backends")


def _package(module: str, known: dict[str, Path]) -> str:
    path = known[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def test_dependencies_point_one_way() -> None:
    known = modules()
    wrong = []
    for module, path in known.items():
        for target, _ in imports(path, known):
            if not _ours(target) or target not in known:
                continue
            if layer(target) > layer(module):
                wrong.append(f"{module} (layer {layer(module)}) imports {target} ({layer(target)})")
            if _under(target, (BENCH,)) and not _under(module, BENCH_USERS):
                wrong.append(f"{module} imports the benchmark tools ({target})")
    assert not wrong, "\n".join(wrong)


def test_no_private_names_imported() -> None:
    known = modules()
    wrong = []
    for module, path in known.items():
        for target, names in imports(path, known):
            if not _ours(target) or target not in known:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                wrong.append(f"{module} imports {private} from {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    known = modules()
    graph = {
        m: sorted({t for t, _ in imports(p, known, deferred=True) if t in known and t != m})
        for m, p in known.items()
    }
    # A package's __init__ importing its own modules is how a package says what it
    # exports: an edge from a module to its own package is not a cycle of the design.
    for m, targets in graph.items():
        graph[m] = [t for t in targets if not m.startswith(t + ".")]
    state: dict[str, int] = {}
    cycles: list[list[str]] = []
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_packages_say_what_they_own() -> None:
    """Every package's __init__.py opens with a docstring (what it owns, exports)."""
    missing = []
    for module, path in modules().items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(_parsed(path))
            if not doc or len(doc.split()) < 8:
                missing.append(module)
    assert not missing, missing


def test_no_family_of_prefixed_modules() -> None:
    """Three or more sibling modules sharing a name prefix are a package waiting to
    be made."""
    families = []
    for module, path in modules().items():
        if path.name != "__init__.py":
            continue
        names = [p.stem for p in path.parent.glob("*.py") if p.stem != "__init__"]
        prefixes: dict[str, list[str]] = {}
        for name in names:
            if "_" in name:
                prefixes.setdefault(name.split("_")[0], []).append(name)
        for prefix, members in prefixes.items():
            siblings = [*members, *(n for n in names if n == prefix)]
            if len(siblings) >= 3:
                families.append(f"{module}: {sorted(siblings)}")
    assert not families, families


def test_backends_share_only_the_common_parts() -> None:
    known = modules()
    packages = {m for m, p in known.items() if m.count(".") == 1 and p.name == "__init__.py"}
    shared = {"backends.egress", "backends.capture"}  # every backend's boundary and recorder
    backend_packages = {m for m in packages if m.startswith("backends.")} - shared
    wrong = []
    for module, path in known.items():
        own = next((b for b in backend_packages if _under(module, (b,))), None)
        if own is None:
            continue
        for target, _ in imports(path, known, deferred=True):
            other = next((b for b in backend_packages if _under(target, (b,))), None)
            if other is not None and other != own:
                wrong.append(f"{module} imports {target}: backends share only backends/'s own")
    assert not wrong, "\n".join(wrong)
