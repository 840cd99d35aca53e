"""The import graph of araopt/ at module level, every import counted (module level, inside functions,
under TYPE_CHECKING): prints each module with the araopt modules it imports, its layer, and any import
circle (strongly connected component of more than one module, or a module importing itself).

    .venv/bin/python tools/import_graph.py [--edges]

Exit status 1 when there is a circle. ``make lint`` checks the layers with import-linter
(``pyproject.toml``); this script shows the graph those contracts are about.
"""
from __future__ import annotations

import argparse
import sys

import grimp


def strongly_connected(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    out.append(component)
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="print every module's imports")
    args = parser.parse_args()
    graph = grimp.build_graph("araopt", include_external_packages=False)
    modules = sorted(graph.modules)
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m)} for m in modules}
    if args.edges:
        for m in modules:
            print(f"{m} -> {', '.join(sorted(edges[m])) or '(nothing of araopt)'}")
    circles = [c for c in strongly_connected(modules, edges) if len(c) > 1 or c[0] in edges[c[0]]]
    total = sum(len(v) for v in edges.values())
    print(f"{len(modules)} modules, {total} imports between them; circles: {len(circles)}")
    for c in circles:
        print("  circle: " + " -> ".join(sorted(c)))
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
