"""The package layering written in ``fedlightning/__init__.py`` holds for every import in
``src/fedlightning``, module-level imports form no cycle, and every package imports on its own in
a fresh interpreter."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "fedlightning"
ENTRY = "entry"
#: imports that break the layering today, each with why it is still there; an allowance no import
#: uses any more fails the test, so it is removed as soon as its import goes
ALLOWED: dict[tuple[str, str], str] = {}


def layers() -> dict[str, str]:
    """``{unit: layer}`` from the table in the package docstring (the one source of the rules)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    assert doc is not None
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=====  ")]
    assert len(rules) == 3, "the layer table (three ===== rules) is missing from the docstring"
    table: dict[str, str] = {}
    layer = ""
    for line in lines[rules[1] + 1 : rules[2]]:
        if not line.startswith(" "):
            layer, line = line.split(maxsplit=1)
        for unit in line.split():
            table[unit] = layer
    return table


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def unit_of(name: str, table: dict[str, str]) -> str:
    """The table's unit holding module ``name`` (its longest listed prefix)."""
    if name == "fedlightning":
        return name
    parts = name.removeprefix("fedlightning.").split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in table:
            return ".".join(parts[:end])
    raise AssertionError(f"{name} belongs to no layer of the package docstring's table")


def imported(node: ast.AST) -> list[str]:
    """The modules an import statement loads (``from a import b``: ``a.b`` when it is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = [f"{node.module}.{a.name}" for a in node.names]
        return [node.module, *(s for s in subs if s.startswith("fedlightning") and is_module(s))]
    return []


def all_imports() -> dict[str, set[str]]:
    """Per module of the package, every module it imports anywhere (functions, typing blocks)."""
    return {
        module_name(path): {
            n for node in ast.walk(ast.parse(path.read_text())) for n in imported(node)
        }
        for path in PACKAGE.rglob("*.py")
    }


def runtime_imports(body: list[ast.stmt]) -> set[str]:
    """The modules imported when a module body runs: not in functions, not under TYPE_CHECKING."""
    found: set[str] = set()
    for statement in body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            found |= runtime_imports(statement.orelse)
            continue
        found.update(imported(statement))
        for field in ("body", "orelse", "finalbody", "handlers"):
            found |= runtime_imports(getattr(statement, field, []))
    return found


def violation(source: str, target: str, table: dict[str, str]) -> str | None:
    """Why ``source`` may not import ``target`` (``None``: it may)."""
    if (
        target.split(".")[0] in ("lightning", "pytorch_lightning")
        and unit_of(source, table) == "server"
    ):
        return "server imports no Lightning (plain torch on state_dicts)"
    if not target.startswith("fedlightning"):
        return None
    src, dst = unit_of(source, table), unit_of(target, table)
    if src == dst or table.get(src, ENTRY) == ENTRY:
        return None
    if table.get(dst, ENTRY) == ENTRY:
        return f"{dst} is an entry point"
    if src == "clients" and dst == "server":
        return "clients and server meet only through fedlightning.protocol"
    src_layer, dst_layer = int(table[src]), int(table[dst])
    if dst_layer < src_layer or src_layer == dst_layer == 0:
        return None
    return f"{src} (layer {src_layer}) imports {dst} (layer {dst_layer})"


def test_every_import_respects_the_layering():
    table = layers()
    found, used = [], set()
    for source, targets in sorted(all_imports().items()):
        for target in sorted(targets):
            why = violation(source, target, table)
            if why is None:
                continue
            if (source, target) in ALLOWED:
                used.add((source, target))
            else:
                found.append(f"{source} imports {target}: {why}")
    assert not found, "\n".join(found)
    stale = set(ALLOWED) - used
    assert not stale, f"no longer needed, remove from ALLOWED: {sorted(stale)}"


def test_the_layering_catches_upward_imports():
    """The rules themselves: each of these imports (the issue's findings among them) is refused."""
    table = layers()
    refused = [
        ("fedlightning.clients.mutual", "fedlightning.loop.evaluation"),
        ("fedlightning.flower_app.connect", "fedlightning.backends.base"),
        ("fedlightning.backends.auto", "fedlightning.loop.core"),
        ("fedlightning.clients.base", "fedlightning.server.base"),
        ("fedlightning.server.fedavg", "lightning.pytorch"),
        ("fedlightning.server.fedavg", "fedlightning.data.datamodule"),
        ("fedlightning.fit", "fedlightning.backends.base"),
        ("fedlightning.loop.core", "fedlightning.cli"),
        ("fedlightning.server.scaffold", "fedlightning.clients.scaffold"),
        ("fedlightning.server.base", "fedlightning.loop.server_device"),
        ("fedlightning.clients.base", "fedlightning.backends.base"),
    ]
    assert [pair for pair in refused if violation(*pair, table) is None] == []
    assert violation("fedlightning.loop.core", "fedlightning.backends.base", table) is None
    assert violation("fedlightning.state", "fedlightning.placement", table) is None
    assert violation("fedlightning.cli", "fedlightning.loop", table) is None


def test_module_level_imports_form_no_cycle():
    """A cycle of module-level imports is a runtime import cycle waiting for the wrong first
    import. A module's own parent packages are left out: Python imports them before it."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for target in runtime_imports(ast.parse(path.read_text()).body):
            parts = target.split(".")
            # importing a.b.c runs a, a.b and a.b.c
            targets |= {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
        ancestors = {".".join(name.split(".")[:end]) for end in range(1, name.count(".") + 1)}
        graph[name] = sorted((targets & set(modules)) - ancestors - {name})
    cycles, state = [], dict.fromkeys(graph, 0)  # 0: new, 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state[nxt] == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif state[nxt] == 0:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node, [node])
    assert cycles == [], "\n".join(cycles)


def test_each_package_imports_first_in_a_fresh_interpreter():
    """Each package imported as the first fedlightning module of a process (the package's modules
    are dropped from ``sys.modules`` between imports; torch and Lightning stay loaded: cheap)."""
    names = [
        module_name(p)
        for p in sorted(PACKAGE.glob("*/__init__.py")) + sorted(PACKAGE.glob("*.py"))
        if p.name != "__main__.py"
    ]
    code = (
        "import importlib, sys, traceback\n"
        "import torch, lightning.pytorch\n"
        "try:\n    import flwr\nexcept ImportError:\n    flwr = None\n"
        f"for name in {names!r}:\n"
        "    if name.startswith('fedlightning.flower_app') and flwr is None:\n"
        "        continue\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'fedlightning']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        print('FAILED', name, traceback.format_exc(limit=-3))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stdout, done.stdout
