"""DESIGN's "one home per fact" rules that the code itself can be checked for: no module imports
another module's private names, and the compiler's modules import each other without a cycle
(lazy imports inside functions included)."""
import ast
from pathlib import Path

import kernelab

PACKAGE = Path(kernelab.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(module imported, names) of every ``from ... import`` in the file, relative ones resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        yield module, [a.name for a in node.names]


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_no_module_imports_another_modules_private_names():
    private = []
    for path in PACKAGE.rglob("*.py"):
        for module, names in _imports(path):
            if not module.startswith("kernelab"):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__") and not _is_module(f"{module}.{n}"):
                    private.append(f"{_module_name(path)}: from {module} import {n}")
    assert private == [], "\n".join(private)


def test_the_compiler_has_no_import_cycle():
    """Its subpackages too (``compiler/templates``): a template imports the shared emitter and
    ``templates/base.py``, never the group runner that calls it."""
    compiler = {_module_name(p): p for p in (PACKAGE / "compiler").rglob("*.py") if p.name != "__init__.py"}
    edges = {m: set() for m in compiler}
    for m, path in compiler.items():
        for module, names in _imports(path):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in compiler] or [module]
            edges[m] |= {t for t in targets if t in compiler and t != m}
    cycles = []

    def walk(node, path):
        for nxt in edges[node]:
            if nxt in path:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in done:
                walk(nxt, path + [nxt])
        done.add(node)

    done: set = set()
    for m in edges:
        walk(m, [m])
    assert cycles == [], "\n".join(sorted(set(cycles)))
