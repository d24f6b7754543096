"""The package's imports go downward through ONE ordered list of layers, and never form a cycle.

The graph is read from the source (``ast``): absolute, relative and function-level imports alike
(a lazy import that closes a cycle is still a cycle to a reader); only ``if TYPE_CHECKING:``
imports, which never run, are left out. Three rules, no per-edge exceptions:

1. **Every edge goes down or sideways** in :data:`LAYERS` (lowest first). A module belongs to the
   layer of the longest prefix that names it; a module no prefix names fails (place it).
2. **No module cycle**, but exactly one: the core's ``Tensor`` <-> ops cycle (:data:`CORE_CYCLE`).
   ``Tensor``'s methods *are* the ops (``x.sum()`` calls ``ops_reduce``) and each op builds
   ``Tensor`` results, so the two are one concept split over files; torch has the same shape
   (``torch/_tensor.py`` <-> ``torch/functional.py``). docs/architecture.md says why.
3. **No folder cycle**: collapse each module to its folder (a module directly in the flat
   packages ``neural_arch`` and ``neural_arch.distributed`` stands for itself) and the folders
   must form no cycle either.

Example of what fails: ``comm/work.py`` importing ``distributed.groups`` (comm sits below the
group layer); ``a.py`` importing ``b.py`` that imports ``a.py`` inside a function; the folder
``algorithms/`` importing ``ddp/`` while ``ddp/`` imports ``algorithms/``.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = "neural_arch"
D = "neural_arch.distributed."

#: The layers, lowest first: (name, module prefixes). An import may go to its own layer or below.
LAYERS: list[tuple[str, list[str]]] = [
    # arrays, settings, files, the profiler's event seam: no Tensor yet
    ("foundation", ["neural_arch.config", "neural_arch.backend", "neural_arch.allocator", "neural_arch.blas_idle", "neural_arch.memory",
                    "neural_arch.utils.atomic_file",
                    "neural_arch.profiler", "neural_arch.cuda"]),
    ("core", ["neural_arch.core"]),                       # Tensor, autograd, the ops
    ("functional", ["neural_arch.nn.functional", "neural_arch.optim.clip"]),
    ("nn", ["neural_arch.nn", "neural_arch.serialization", "neural_arch.utils"]),
    ("training", ["neural_arch.optim", "neural_arch.amp", "neural_arch.data", "neural_arch.optimization"]),
    ("torch face", ["neural_arch"]),                      # `import neural_arch as na`
    # -- distributed, lowest first --------------------------------------------------------------
    ("shared low-level", [D + "errors", D + "host", D + "launch_env", D + "auth", D + "flight_recorder"]),
    ("rendezvous", [D + "rendezvous"]),
    ("comm", [D + "comm"]),                               # arrays only: the Backend interface and its runner
    ("backends", [D + "comm.gloo", D + "comm.mpi", D + "comm.nccl", D + "comm.local"]),
    ("groups", [D + "state", D + "process_group", D + "resolve", D + "groups", D + "subgroups", D + "info",
                D + "stall"]),
    ("algorithms", [D + "algorithms"]),                   # hierarchical all-reduce, DDP comm hooks
    ("collectives", [D + "collectives", D + "object_collectives", D + "device_mesh", D + "nn", D + "topology",
                     D + "metrics", D + "flat_param", D + "bucketing"]),
    ("strategies", [D + "ddp", D + "tensor", D + "pipelining", D + "fsdp", D + "optim", D + "checkpoint", D + "data",
                    D + "expert_parallel", D + "model_parallel"]),
    ("processes", [D + "run", D + "testing", D + "elastic", D + "ft"]),
    ("launcher and trainer", [D + "launcher", D + "trainer", D + "scale"]),
    ("distributed face", ["neural_arch.distributed"]),
    ("serving", ["neural_arch.serve"]),                   # HTTP on rank 0 over TP ranks the launcher starts
]

#: The one cycle the design keeps (rule 2): Tensor's methods are the ops, the ops return Tensors.
CORE_CYCLE = frozenset({
    "neural_arch.core.tensor", "neural_arch.core.factory", "neural_arch.core.op_utils", "neural_arch.core.ops_activation",
    "neural_arch.core.ops_basic", "neural_arch.core.ops_inplace", "neural_arch.core.ops_reduce", "neural_arch.core.ops_shape",
    "neural_arch.core.tensor_methods",
})

#: Packages whose modules stand for themselves in the folder graph (torch keeps these flat too).
FLAT_PACKAGES = frozenset({"neural_arch", "neural_arch.distributed"})


# ------------------------------------------------------------------------------------ reading
def _modules(root: pathlib.Path = ROOT) -> dict:
    mods = {}
    for path in (root / PKG).rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"


def _import_targets(node, mod: str, is_package: bool, mods: dict) -> list[str]:
    """The modules an ``import`` statement of ``mod`` needs (a ``from pkg import submodule`` needs
    the submodule, not the package's other names)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: resolve against the importing module's package
        base = mod.split(".") if is_package else mod.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module
    subs = [f"{module}.{a.name}" for a in node.names]
    targets = [t for t in subs if t in mods]
    if len(targets) < len(subs):
        targets.append(module)
    return targets


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
            if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _import_targets(node, mod, path.name == "__init__.py", mods):
                if target.startswith(PKG):
                    dep = owner(target)
                    if dep and dep != mod:
                        graph[mod].add(dep)
    return graph


# ------------------------------------------------------------------------------------ checking
def _layer_of(module: str, layers=LAYERS) -> int | None:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def upward_edges(graph: dict, layers=LAYERS) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        here = _layer_of(mod, layers)
        for dep in sorted(deps):
            there = _layer_of(dep, layers)
            if here is not None and there is not None and there > here:
                bad.append(f"{mod} ({layers[here][0]}) imports {dep} ({layers[there][0]})")
    return bad


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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


def folder_graph(graph: dict, packages: set) -> dict:
    """Each module collapsed to its folder (modules of FLAT_PACKAGES stand for themselves)."""
    def unit(m):
        folder = m if m in packages else m.rpartition(".")[0]
        return m if folder in FLAT_PACKAGES and m not in packages else folder

    folders: dict = {}
    for mod, deps in graph.items():
        a = unit(mod)
        folders.setdefault(a, set())
        for dep in deps:
            b = unit(dep)
            folders.setdefault(b, set())
            if a != b:
                folders[a].add(b)
    return folders


# ------------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def mods():
    return _modules()


@pytest.fixture(scope="module")
def graph(mods):
    return _graph(mods)


def test_every_module_has_a_layer(mods):
    unplaced = sorted(m for m in mods if _layer_of(m) is None)
    assert not unplaced, f"modules in no layer (add their folder to LAYERS where it belongs): {unplaced}"


def test_imports_go_down_the_one_list_of_layers(graph):
    bad = upward_edges(graph)
    assert not bad, "upward imports (move the shared piece one layer down):\n" + "\n".join(bad)


def test_no_module_cycle_but_the_core_one(graph):
    cycles = [set(c) for c in _cycles(graph)]
    others = [sorted(c) for c in cycles if c != CORE_CYCLE]
    assert not others, f"import cycles (move the shared piece one layer down): {others}"
    assert CORE_CYCLE in cycles, ("the core's Tensor <-> ops cycle changed: update CORE_CYCLE and "
                                  "docs/architecture.md (or celebrate: it is gone)")


def test_no_folder_cycle(mods, graph):
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    cycles = _cycles(folder_graph(graph, packages))
    assert not cycles, f"folders that import each other: {cycles}"


# -- the checker itself, on planted faults ------------------------------------------------------
def test_a_planted_upward_import_relative_and_lazy_fails(tmp_path):
    pkg = tmp_path / PKG
    (pkg / "distributed" / "comm").mkdir(parents=True)
    for init in (pkg, pkg / "distributed", pkg / "distributed" / "comm"):
        (init / "__init__.py").write_text("")
    (pkg / "distributed" / "groups.py").write_text("X = 1\n")
    # comm (below groups) reaches up, relatively and inside a function: still an upward edge
    (pkg / "distributed" / "comm" / "work.py").write_text("def f():\n    from .. import groups\n")
    graph = _graph(_modules(tmp_path))
    assert graph[D + "comm.work"] == {D + "groups"}
    assert upward_edges(graph) == [f"{D}comm.work (comm) imports {D}groups (groups)"]


def test_a_planted_module_cycle_and_folder_cycle_fail():
    fake = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(fake)) == [["a", "b"], ["c", "d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # two folders whose modules import each other, with no module cycle
    mods = {D + "x.one": {D + "y.two"}, D + "y.three": {D + "x.four"}, D + "x.four": set(), D + "y.two": set()}
    assert _cycles(mods) == []
    assert _cycles(folder_graph(mods, set())) == [[D + "x", D + "y"]]
