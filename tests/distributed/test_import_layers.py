"""The package's imports go downward and never form a cycle (issue 9's layout rule).

The graph is read from the source (``ast``), function-level imports included: a lazy import that
closes a cycle is still a cycle to a reader. Layers, lowest first::

    core, backend, config  <  distributed.{errors,state,config}  <  rendezvous  <  comm
        <  process_group, resolve, groups, collectives  <  algorithms, parallel, checkpoint, data  <  run

Two edges cross these layers on purpose and are not checked: the TCP store (rendezvous) uses the
one authenticated handshake that lives with the transports (``comm/transport/handshake.py``), and
``groups`` reads the launcher's environment contract through ``run/env.py``.

Example of what fails: ``comm/work.py`` importing ``distributed.groups`` (comm is arrays only and
sits below the group layer), or ``a.py`` importing ``b.py`` that imports ``a.py`` inside a function.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = "neural_arch"
D = "neural_arch.distributed."

#: (importing layer, layers it must not import, known exceptions with the reason)
RULES = [
    ("neural_arch.core", ["neural_arch.distributed", "neural_arch.nn", "neural_arch.optim"], {}),
    (D + "comm", [D + x for x in ("groups", "subgroups", "collectives", "object_collectives", "process_group",
                                  "resolve", "parallel", "algorithms", "checkpoint", "data", "run", "elastic")], {}),
    (D + "rendezvous", [D + x for x in ("groups", "collectives", "parallel", "algorithms", "checkpoint", "run")], {}),
    (D + "groups", [D + x for x in ("collectives", "parallel", "algorithms", "checkpoint")], {}),
    (D + "collectives", [D + x for x in ("parallel", "checkpoint", "run")], {}),
    (D + "parallel", [D + "run"], {}),
]


def _modules() -> dict:
    mods = {}
    for path in (ROOT / PKG).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"


def _graph(mods: dict) -> dict:
    def owner(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue  # `if TYPE_CHECKING:` imports never run
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import submodule` needs the submodule, not the package's other names
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in mods]
                if len(targets) < len(subs):
                    targets.append(node.module)
            else:
                continue
            for target in targets:
                if target.startswith(PKG):
                    dep = owner(target)
                    if dep and dep != mod:
                        graph[mod].add(dep)
    return graph


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


@pytest.fixture(scope="module")
def graph():
    return _graph(_modules())


def test_no_import_cycle(graph):
    cycles = _cycles(graph)
    assert not cycles, f"import cycles (move the shared piece one layer down): {cycles}"


@pytest.mark.parametrize("layer,forbidden,allowed", RULES, ids=[r[0] for r in RULES])
def test_imports_go_downward(graph, layer, forbidden, allowed):
    bad = sorted((mod, dep) for mod, deps in graph.items() if mod == layer or mod.startswith(layer + ".")
                 for dep in deps
                 if any(dep == f or dep.startswith(f + ".") for f in forbidden) and (mod, dep) not in allowed)
    assert not bad, f"{layer} imports a layer above it: {bad}"


def test_the_checker_finds_cycles():
    # The checker itself, on a made-up graph: a lazy two-module cycle and a three-module one.
    fake = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(fake)) == [["a", "b"], ["c", "d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
