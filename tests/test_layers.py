"""The import graph, read from the source: dependencies point one way (docs/design.md) and no module imports
itself round a circle. A test that fails names the arrow or the circle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "forgetting_transformer"
# layer of each part of the package; an import may only point to a lower layer or within its own part
LAYERS = {"ops": 0, "data": 0, "plotting": 0, "markdown": 0, "config": 1, "models": 1, "training": 2, "inference": 2,
          "hf": 3}
# above the package (its root module, which imports nothing of it, at 4): the evaluations and tools, then the
# scripts and train.py; nothing in the package imports these
TOP = {"eval": 5, "benchmarks": 5, "hydra_plugins": 5, "scripts": 6, "train": 6}


def modules() -> dict[str, Path]:
    out = {}
    for top in (PKG, *TOP):
        paths = [ROOT / f"{top}.py"] if (ROOT / f"{top}.py").is_file() else sorted((ROOT / top).rglob("*.py"))
        for p in paths:
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The repository modules ``name`` imports (anywhere in the file): ``from a import b`` counts as importing the
    module ``a.b`` where there is one, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer(name: str):
    parts = name.split(".")
    if parts[0] != PKG:
        return TOP[parts[0]], parts[0]
    return (LAYERS[parts[1]], parts[1]) if len(parts) > 1 else (4, PKG)


def test_every_part_of_the_package_has_a_layer():
    parts = {n.split(".")[1] for n in modules() if n.startswith(PKG + ".")}
    assert parts <= set(LAYERS), f"give {sorted(parts - set(LAYERS))} a layer in LAYERS and docs/design.md"


def upward(g: dict[str, set[str]]) -> list[str]:
    """The arrows that point to the same layer's other part or to a higher layer."""
    return sorted(f"{a} -> {b}" for a, targets in g.items() for b in targets
                  if layer(b)[1] != layer(a)[1] and layer(b)[0] >= layer(a)[0])


def test_imports_point_down_the_layers():
    assert upward(graph()) == [], "imports that run up or across the layers (ops, data, plotting, markdown < config, " \
                        "models < training, inference < hf < eval, benchmarks, hydra_plugins < scripts, train.py)"


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                on.discard(w)
                comp.append(w)
            on.discard(v)
            if comp:
                out.append(sorted([v, *comp]))

    for v in list(g):
        if v not in index:
            visit(v)
    return out


def test_no_circles():
    assert cycles(graph()) == []


def test_the_checks_catch_an_upward_arrow_and_a_circle():
    g = {"forgetting_transformer.models.a": {"forgetting_transformer.training.b"},
         "forgetting_transformer.training.b": {"forgetting_transformer.models.a"}}
    assert cycles(g) == [sorted(g)]
    assert upward(g) == ["forgetting_transformer.models.a -> forgetting_transformer.training.b"]
    assert upward({"forgetting_transformer.training.b": {"forgetting_transformer.inference.c"},
                   "scripts.x": {"eval.y", "forgetting_transformer.hf"}}) == [
        "forgetting_transformer.training.b -> forgetting_transformer.inference.c"]


# Inside ops: one package per op, each level importing only lower levels, and no op importing another (they share
# only the launch cache and the options). A module missing here fails the test: place it.
OP_LEVELS = [
    ["launch_cache", "options"],
    ["forgetting_attention.triton", "forgetting_attention.gluon",
     "forgetting_attention.triton.kernels", "forgetting_attention.gluon.kernels", "decode.attention", "decode.write",
     "path.reference"],
    ["forgetting_attention.tiles", "forgetting_attention.acp", "decode", "path"],
    ["forgetting_attention.reference", "forgetting_attention.triton.launch"],
    ["forgetting_attention.gluon.launch"],
    ["forgetting_attention.autograd"],
    ["forgetting_attention"],
    ["forgetting_attention.stages"],
]
OPS = PKG + ".ops"
SHARED = ("launch_cache", "options")  # what every op may import


def op_level(name: str) -> int:
    short = name[len(OPS) + 1:]
    return next(i for i, names in enumerate(OP_LEVELS) if short in names)


def op_arrows(g: dict[str, set[str]]) -> list[str]:
    """Arrows inside ops that do not point to a lower level, or that join two ops other than by the launch cache."""
    bad = []
    for a, targets in g.items():
        for b in targets:
            if not (a.startswith(OPS + ".") and b.startswith(OPS + ".")):
                continue
            op_a, op_b = (x[len(OPS) + 1:].split(".")[0] for x in (a, b))
            if op_level(b) >= op_level(a) or (op_a != op_b and op_b not in SHARED):
                bad.append(f"{a} -> {b}")
    return sorted(bad)


def test_every_ops_module_has_a_level():
    placed = {f"{OPS}.{n}" for names in OP_LEVELS for n in names}
    assert {n for n in modules() if n.startswith(OPS + ".")} == placed


def test_each_op_imports_only_its_own_lower_levels():
    assert op_arrows(graph()) == []


def test_the_ops_check_catches_an_arrow_up_and_one_across_ops():
    g = {f"{OPS}.forgetting_attention.tiles": {f"{OPS}.forgetting_attention.autograd"},
         f"{OPS}.decode.attention": {f"{OPS}.forgetting_attention.acp", f"{OPS}.launch_cache"}}
    assert op_arrows(g) == [f"{OPS}.decode.attention -> {OPS}.forgetting_attention.acp",
                            f"{OPS}.forgetting_attention.tiles -> {OPS}.forgetting_attention.autograd"]

