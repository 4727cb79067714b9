"""The house rules of docs/architecture.md, checked on the installed package's source (an AST walk).

Layers, lowest first; a module may import its own layer and the layers below it:

    kernels <- core <- planner <- engine <- nets <- {parallel, report, sklearn} <- cli

``data`` imports nothing of fastckpt and anyone may import it; parallel, report and
sklearn never import each other; the facade (``fastckpt/__init__.py``,
``fastckpt.distributed``, ``fastckpt.optimizers``, ``__main__``) may import anything and nothing
imports it.  Besides: no import circles between modules (local imports
included), no ``_private`` name imported from another module, the kernels
reached only through ``fastckpt.kernels``, one engine (the run kernel made and
called in ``fastckpt.engine`` alone, and no layer kernel in ``fastckpt.parallel``:
a parallel mode adds sums and a schedule, never a forward or backward of its
own), no class assembled from mixins (several bases, exceptions aside), and
functions of at most 60 lines outside the kernels.
"""
import ast
import importlib.util
import pathlib
import pkgutil

LAYERS = ["kernels", "core", "planner", "engine", "nets", "parallel", "report", "sklearn", "cli"]
RANK = {"kernels": 0, "core": 1, "planner": 2, "engine": 3, "nets": 4, "parallel": 5, "report": 5, "sklearn": 5,
        "cli": 6}
FACADE = {"fastckpt", "fastckpt.distributed", "fastckpt.optimizers", "fastckpt.__main__"}
LEAVES = {"fastckpt._version"}                       # import nothing; anyone may import them
MAX_FUNCTION_LINES = 60
ENGINE = "engine"                                    # the one layer that runs op tables on the run kernel
LAYER_KERNELS = {"runner", "gemm", "bias_activation", "bias_identity", "bias_log_softmax", "bias_relu", "bias_sigmoid",
                 "bias_tanh", "dense_backward", "dense_backward_input", "dense_backward_sgd", "dense_forward",
                 "dense_forward_layer", "dense_forward_log_softmax", "cross_entropy_delta", "quadratic_delta",
                 "squared_error_delta", "sgd_step", "adam_step", "momentum_step", "counted_adam_step",
                 "counted_momentum_step"}


def sources():
    """``{module name: source text}`` of every module of the installed fastckpt, kernels included."""
    import fastckpt.kernels

    import fastckpt
    found = {"fastckpt": pathlib.Path(fastckpt.__file__)}
    for pkg, prefix in ((fastckpt, "fastckpt."), (fastckpt.kernels, "fastckpt.kernels.")):
        found[prefix.rstrip(".")] = pathlib.Path(pkg.__file__)
        for info in pkgutil.walk_packages(pkg.__path__, prefix):
            spec = importlib.util.find_spec(info.name)
            found[info.name] = pathlib.Path(spec.origin)
    return {name: path.read_text() for name, path in found.items()}


def layer(module):
    """The layer of a module name: one of LAYERS, 'data', 'facade' or 'leaf'."""
    if module in FACADE:
        return "facade"
    if module in LEAVES:
        return "leaf"
    return module.split(".")[1]


def imports(module, source, known):
    """``(line, target module, names)`` for every import of fastckpt in ``source``, wherever it is."""
    package = module if _is_package(module, source, known) else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "fastckpt"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "fastckpt":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((node.lineno, sub, []) if sub in known else (node.lineno, base, [alias.name]))
    return out


def _is_package(module, source, known):
    return any(other.startswith(module + ".") for other in known)


def violations(modules):
    """Every broken rule in ``modules`` (``{name: source}``), as readable lines."""
    found, graph = [], {m: set() for m in modules}
    for module, source in modules.items():
        mine = layer(module)
        for line, target, names in imports(module, source, modules):
            where = f"{module}:{line} imports {target}"
            graph[module].add(target)
            theirs = layer(target)
            if any(n.startswith("_") and not n.startswith("__") for n in names):
                found.append(f"{where}: private name {', '.join(names)}")
            if target.startswith("fastckpt.kernels.") and mine != "kernels":
                found.append(f"{where}: the kernels' public face is fastckpt.kernels")
            if target == "fastckpt.kernels" and "runner" in names and mine != ENGINE:
                found.append(f"{where}: the run kernel is the engine's alone")
            if target == "fastckpt.kernels" and mine == "parallel" and set(names) & LAYER_KERNELS:
                found.append(f"{where}: a layer kernel in parallel ({', '.join(sorted(set(names) & LAYER_KERNELS))}): "
                             "the engine runs every layer")
            if mine in ("facade",) or theirs == "leaf" or target == module:
                continue
            if mine == "leaf" or theirs == "facade":
                found.append(f"{where}: {'a leaf imports nothing' if mine == 'leaf' else 'nothing imports the facade'}")
            elif mine == "data" or theirs == "data":
                if mine == "data" and theirs != "data":
                    found.append(f"{where}: data imports nothing of fastckpt")
            elif RANK[theirs] > RANK[mine] or (RANK[theirs] == RANK[mine] and theirs != mine):
                found.append(f"{where}: {mine} may not import {theirs} (upward or sideways)")
    found += [f"import circle: {' -> '.join(c)}" for c in _circles(graph)]
    found += _sizes(modules)
    return found


def _circles(graph):
    """Circles of module imports (each reported once, from its smallest module)."""
    circles, state = set(), {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt):] + [nxt]
                k = cycle.index(min(cycle[:-1]))
                circles.add(tuple(cycle[k:-1] + cycle[:k + 1]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return sorted(circles)


def _sizes(modules):
    """Functions over :data:`MAX_FUNCTION_LINES` outside the kernels, and classes of several bases (mixins that
    read their host's attributes), exceptions aside, anywhere."""
    out = []
    for module, source in modules.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and len(node.bases) > 1 and not any(
                    ast.unparse(base).endswith(("Error", "Exception", "Warning")) for base in node.bases):
                out.append(f"{module}:{node.lineno} class {node.name}: {len(node.bases)} bases, a class of mixins")
            if layer(module) == "kernels":
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{module}:{node.lineno} {node.name}: {length} lines, over {MAX_FUNCTION_LINES}")
    return out
