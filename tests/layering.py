"""The house rules of docs/architecture.md, checked on the installed package's source (an AST walk).

Layers, lowest first; a module may import its own layer and the layers below it:

    kernels <- core <- planner <- engine <- nets <- {parallel, report, sklearn} <- cli

``data`` imports nothing of fastckpt and anyone may import it; parallel, report and
sklearn never import each other; the facade (``fastckpt/__init__.py``,
``fastckpt.distributed``, ``fastckpt.optimizers``, ``__main__``) may import anything and nothing
imports it.  Besides: no import circles between modules (local imports
included), no ``_private`` name imported from another module, the kernels
reached only through ``fastckpt.kernels``, and size budgets.
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
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


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
    out = []
    for module, source in modules.items():
        if layer(module) == "kernels":
            continue
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{module}: {lines} lines, over {MAX_MODULE_LINES}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{module}:{node.lineno} {node.name}: {length} lines, over {MAX_FUNCTION_LINES}")
    return out
