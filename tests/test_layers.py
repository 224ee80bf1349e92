"""The layering of docs/ARCHITECTURE.md, checked on the source: which folder may
import which, and no import cycle among the project's modules at module level."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("pipeline", "agents", "tables", "adapters", "config")


def _modules() -> dict[str, Path]:
    out = {}
    for top in TOPS:
        for p in (ROOT / top).rglob("*.py"):
            rel = p.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts)
            out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path, top_level_only: bool = False) -> set[str]:
    """Project modules ``name`` imports (``top_level_only``: not inside a function)."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            found |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join(parts + ([n.module] if n.module else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in n.names}
    return {m for m in found if m in MODULES and m != name}


def _importers(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for name, path in MODULES.items():
        if name == prefix or name.startswith(prefix + "."):
            for dep in _imports(name, path):
                if any(dep == f or dep.startswith(f + ".") for f in forbidden):
                    bad.append(f"{name} -> {dep}")
    return sorted(bad)


HIGHER_THAN_DOMAIN = ("pipeline.transport", "pipeline.store", "pipeline.api", "pipeline.cli", "pipeline.app",
                      "pipeline.runtime", "agents", "tables", "adapters")


@pytest.mark.parametrize("layer, forbidden", [
    # the engine: a Faust transport any Faust app can use
    ("pipeline.transport", tuple(m for m in TOPS if m != "pipeline") + tuple(
        m for m in MODULES if m.startswith("pipeline.") and not m.startswith("pipeline.transport"))),
    # the domain: pure, no I/O layer
    ("pipeline.rules", HIGHER_THAN_DOMAIN),
    ("pipeline.parsers", HIGHER_THAN_DOMAIN),
    ("pipeline.models", HIGHER_THAN_DOMAIN),
    ("pipeline.topics", HIGHER_THAN_DOMAIN),
    ("pipeline.ids", HIGHER_THAN_DOMAIN),
    # the edges
    ("adapters", ("agents", "tables", "pipeline.api", "pipeline.cli", "pipeline.app", "pipeline.store",
                  "pipeline.runtime")),
    ("pipeline.store", ("agents", "tables", "adapters", "pipeline.api", "pipeline.cli", "pipeline.app",
                        "pipeline.runtime")),
    # agents: below the API and the CLI
    ("agents", ("pipeline.api", "pipeline.cli")),
    ("tables", ("agents", "pipeline.api", "pipeline.cli", "adapters")),
    # the API serves; it does not run agents nor the CLI
    ("pipeline.api", ("agents", "pipeline.cli")),
])
def test_no_import_from_a_lower_layer_to_a_higher_one(layer, forbidden):
    assert _importers(layer, forbidden) == []


def test_no_import_cycle_at_module_level():
    graph = {name: _imports(name, path, top_level_only=True) for name, path in MODULES.items()}
    # a package's __init__ re-exporting its own modules is not a cycle through them
    for name in graph:
        graph[name] = {d for d in graph[name] if not (name.startswith(d + ".") and d in graph)}
    seen, stack, cycles = set(), [], []

    def visit(node, path):
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in seen:
            return
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            visit(dep, path)
        path.pop()
        seen.add(node)

    for name in sorted(graph):
        visit(name, stack)
    assert cycles == []


def test_the_environment_is_read_in_one_module():
    """Every NOTIFY_* variable is read in config/environment.py (docs/CONFIG.md lists them)."""
    readers = []
    for name, path in MODULES.items():
        if name == "config.environment" or name.startswith("adapters.simulators"):
            continue
        text = path.read_text()
        for needle in ('environ.get("NOTIFY_', "environ['NOTIFY_", 'environ["NOTIFY_', 'getenv("NOTIFY_'):
            if needle in text:
                readers.append(name)
    assert readers == []


def test_the_documented_table_is_the_code_s():
    from config.environment import table

    assert table() in (ROOT / "docs" / "CONFIG.md").read_text()
