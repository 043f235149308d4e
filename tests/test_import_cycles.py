"""No module of ``nvdaemon`` imports itself back: the import graph of the package, module by module, has no cycle.

The graph is grimp's (the one ``lint-imports`` checks the layers on), and it counts every import in a module's
source: ``TYPE_CHECKING`` blocks and imports inside functions too. A cycle through a type-only import is still two
modules that each need the other to be read; one through a function-level import is still a package that cannot be
split where its layout says. A package's ``__init__`` is a module like the others: a submodule importing from it
while it imports that submodule is a cycle.
"""

from __future__ import annotations

import grimp

import nvdaemon

ROOT = nvdaemon.__name__


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), each sorted,
    found with Tarjan's algorithm (iteratively: no recursion limit on a deep graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    work: list[tuple[str, list[str]]] = []  # the depth-first path: each module with the imports left to follow
    for root in sorted(graph.modules):
        if root in index:
            continue
        nxt: str | None = root
        while nxt is not None or work:
            if nxt is not None:  # entering a module
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, sorted(graph.find_modules_directly_imported_by(nxt))))
                nxt = None
            module, todo = work[-1]
            if todo:
                imported = todo.pop()
                if imported not in index:
                    nxt = imported
                elif imported in on_stack:
                    low[module] = min(low[module], index[imported])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1 or module in graph.find_modules_directly_imported_by(module):
                    found.append(sorted(component))
    return sorted(found)


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """The component's modules and every import between two of them, with the line that makes it: the edges one of
    which must go for the cycle to break."""
    steps = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & set(component)):
            details = graph.get_import_details(importer=importer, imported=imported)
            where = ", ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details) or "?"
            steps.append(f"  {importer} -> {imported}  ({where})")
    return f"{' <-> '.join(component)}:\n" + "\n".join(steps)


def test_the_finder_sees_a_cycle() -> None:
    """The check below cannot pass with a finder that never finds anything."""
    graph = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.e", "p.e")]:
        graph.add_import(importer=importer, imported=imported)
    assert cycles(graph) == [["p.a", "p.b", "p.c"], ["p.e"]]
    assert "p.a -> p.b" in describe(graph, ["p.a", "p.b", "p.c"])
    assert "p.c -> p.a" in describe(graph, ["p.a", "p.b", "p.c"])


def test_no_module_of_the_package_imports_itself_back() -> None:
    graph = grimp.build_graph(ROOT, cache_dir=None)  # TYPE_CHECKING imports included (grimp's default)
    assert len(graph.modules) > 50, "the package was not found where the tests import it from"
    found = cycles(graph)
    assert not found, "import cycles in the package:\n" + "\n".join(describe(graph, c) for c in found)
