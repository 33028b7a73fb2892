"""The package imports one way (docs/architecture.md): each layer imports only the layers listed before
it, and no module imports itself back through others, whether at the top of a file or inside a function
(a cycle "broken" by a function-level import is still a cycle). Imports under `if TYPE_CHECKING:` are
for annotations only and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "torchscope"

# Bottom to top. A module belongs to the first entry that is a prefix of its dotted name.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("torchscope.errors", "torchscope.arrays", "torchscope.files", "torchscope.text", "torchscope.workers"),
    ("torchscope.rundir",),
    ("torchscope.report",),
    ("torchscope.trace",),
    ("torchscope.analysis",),
    ("torchscope.diagnose",),
    ("torchscope.capture", "torchscope.integrations"),
    ("torchscope.pipeline",),
    ("torchscope.render",),
    ("torchscope.server",),
    ("torchscope.cli", "torchscope.examples", "torchscope.__main__"),
)
# The public facade: `torchscope.profile/analyze/load` import their layers lazily, on first use.
FACADE = "torchscope"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package, self.found = module, is_package, set[str]()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names if a.name.startswith("torchscope"))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = self.module.split(".") if self.is_package else self.module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        if not base.startswith("torchscope"):
            return
        self.found.add(base)
        self.found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`


def _graph() -> dict[str, set[str]]:
    sources = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in sources.items():
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        graph[module] = {name for name in visitor.found if name in sources and name != module}
    return graph


GRAPH = _graph()


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m != FACADE))
def test_no_module_imports_a_higher_layer(module: str) -> None:
    upward = sorted(t for t in GRAPH[module] if t != FACADE and _layer(t) > _layer(module))
    assert not upward, f"{module} (layer {_layer(module)}) imports higher layers: {upward}"


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over the module graph: every component is one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node] - {FACADE}:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index and node != FACADE:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_packages_do_not_import_each_other_both_ways() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        source = ".".join(module.split(".")[:2])
        packages.setdefault(source, set()).update(".".join(t.split(".")[:2]) for t in targets if t != FACADE)
    both = sorted({tuple(sorted((a, b))) for a, bs in packages.items() for b in bs if b != a and a in packages.get(b, set())})
    assert not both, f"packages importing each other: {both}"
