"""The package's layers run down, with no circle of files.

Layers, top to bottom (a module imports only its own layer or lower ones):

    apps        jitconv (the package), jitconv.__main__, jitconv.bench, jitconv.testing
    engines     jitconv.integrations (torch custom ops), jitconv.vllm, jitconv.sglang
    public      jitconv.api (the ops, plans, device plans, validation)
    backends    jitconv.backends (one object per device kind; sycl and cuda apart)
    kernels     jitconv.kernels (kernel source, tables, tuning), jitconv.memory
    alone       jitconv.reference, jitconv.version

Imports are read from the source (``ast``), inside functions too. A function-local
import of the package's own modules is allowed only of a module that needs an optional
dependency at import (a kernel framework: numba-dpex, numba-cuda; or matplotlib), never to
dodge an import order; no file reaches itself through imports of any kind.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jitconv"
LAYERS = [  # top first
    ("apps", ("jitconv", "jitconv.__main__", "jitconv.bench", "jitconv.testing")),
    ("engines", ("jitconv.integrations", "jitconv.vllm", "jitconv.sglang")),
    ("public", ("jitconv.api",)),
    ("backends", ("jitconv.backends",)),
    ("kernels", ("jitconv.kernels", "jitconv.memory")),
    ("alone", ("jitconv.reference", "jitconv.version")),
]
OPTIONAL = ("numba_dpex", "numba", "matplotlib")  # imported at the top of some modules


def _modules():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def layer_of(name):
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or (prefix != "jitconv" and name.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    assert best is not None, f"{name}: in no layer (add it to LAYERS)"
    return best[0]


def _targets(module, node):
    """The package's modules an import statement in ``module`` names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if MODULES[module].name != "__init__.py":
                package = package[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                 for a in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:  # `import jitconv.x.y` names jitconv.x.y
            name = name.rpartition(".")[0]
        if name.startswith("jitconv") and name != module:
            out.append(name)
    return out


def _imports():
    """(module, target, local) for every import of the package's own modules, and the
    modules that import an OPTIONAL dependency at their top."""
    edges, optional = [], set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top = set()
        for node in tree.body:
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)) and \
                        not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                              ast.ClassDef)):
                    top.add(id(inner))
                    names = ([a.name for a in inner.names] if isinstance(inner, ast.Import)
                             else [inner.module or ""])
                    if any(n.split(".")[0] in OPTIONAL for n in names):
                        optional.add(module)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, node):
                    edges.append((module, target, id(node) not in top))
    return edges, optional


EDGES, NEEDS_OPTIONAL = _imports()


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_no_module_imports_a_higher_layer():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m, t, _local in EDGES if layer_of(t) < layer_of(m)]
    assert not upward, "\n".join(upward)


def test_backends_do_not_import_each_other():
    across = [f"{m} imports {t}" for m, t, _local in EDGES
              for a, b in (("sycl", "cuda"), ("cuda", "sycl"))
              if m.startswith(f"jitconv.backends.{a}") and t.startswith(f"jitconv.backends.{b}")]
    assert not across, "\n".join(across)


def test_function_local_imports_only_of_optional_dependencies():
    dodging = [f"{m} imports {t} inside a function" for m, t, local in EDGES
               if local and t not in NEEDS_OPTIONAL]
    assert not dodging, "\n".join(dodging)


def test_no_circle_of_files():
    graph = {}
    for m, t, _local in EDGES:
        graph.setdefault(m, set()).add(t)
    state, path, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "\n".join(circles)


@pytest.mark.parametrize("check", [test_no_module_imports_a_higher_layer,
                                   test_no_circle_of_files])
def test_the_checks_can_fail(check, monkeypatch):
    """An upward import and a circle, added to the edges, are found."""
    monkeypatch.setattr(__import__(__name__), "EDGES", EDGES + [
        ("jitconv.kernels.abi", "jitconv.api.ops", False),
        ("jitconv.api.ops", "jitconv.kernels.abi", False)], raising=True)
    with pytest.raises(AssertionError):
        check()


# What the package keeps between calls, outside constant tables: each backend's state
# object (owned by its backend object), the current device, the USM pool, the runtime
# bootstrap's record, the one-shot ops' plan cache, and two context variables (per thread
# or task, not shared). A new module-level cache, lock or counter fails here: it belongs
# in a backend's state.
STATE_NAMES = {
    "jitconv.backends.sycl.state": {"STATE"}, "jitconv.backends.cuda.state": {"STATE"},
    "jitconv.backends.sycl.backend": {"BACKEND"}, "jitconv.backends.cuda.backend": {"BACKEND"},
    "jitconv.backends.devices": {"_current"}, "jitconv.backends.sycl.usm": {"_pool"},
    "jitconv.backends.sycl.bootstrap": {"RUNTIME"}, "jitconv.api.plan_cache": {"_plans"},
    "jitconv.kernels.tuning": {"OVERRIDES"}, "jitconv.vllm.plugin": {"_conv_done"},
    "jitconv.vllm.conventions": {"DEFAULT"},  # an immutable sentinel
}
_MUTABLE_CALLS = {"dict", "list", "set", "Lock", "RLock", "local", "WeakKeyDictionary",
                  "WeakSet", "WeakValueDictionary", "OrderedDict", "defaultdict",
                  "ContextVar", "deque"}


def _state_names():
    """(module, name) of every module-level binding that may hold state: a lowercase name
    bound to a container, a lock, a weak collection, a context variable or an instance of
    a class of the module (UPPER_CASE names bound to literals are constant tables)."""
    found = set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        for node in tree.body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            call = getattr(value.func, "attr", getattr(value.func, "id", "")) \
                if isinstance(value, ast.Call) else None
            for target in targets:
                if not isinstance(target, ast.Name) or target.id.startswith("__"):
                    continue
                name = target.id
                constant = name.lstrip("_")[:1].isupper()
                literal = isinstance(value, (ast.Dict, ast.List, ast.Set))
                if (literal and not constant) or call in _MUTABLE_CALLS - {"dict"} or \
                        call in classes or (call == "dict" and not constant) or \
                        (isinstance(value, ast.Constant) and value.value is None
                         and not constant):
                    found.add((module, name))
    return found


def test_state_lives_in_the_backend_objects():
    allowed = {(m, n) for m, names in STATE_NAMES.items() for n in names}
    extra = sorted(_state_names() - allowed)
    assert not extra, f"module-level state outside the backends' state objects: {extra}"
    assert len(allowed) <= 12
