"""The layering of docs/ARCHITECTURE.md, checked on the source: every `import` of every module
(inside functions and `TYPE_CHECKING` blocks too) is parsed, and a layer may import only the
layers its row allows. The command-line entry points (`cli`, `compact_cli`, `token_cli`,
`testing`) are the one place that reaches the server, as `headwater serve` must."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "headwater"
LAYERS = ("wire", "storage", "durables", "server", "spark_compaction")
ENTRY_POINTS = {"cli", "cli_cluster", "compact_cli", "token_cli", "testing", "__main__"}

ALLOWED = {
    "wire": {"wire"},
    "storage": {"wire", "storage"},
    "durables": {"wire", "durables"},
    "server": {"wire", "storage", "durables", "server"},
    "spark_compaction": {"wire", "storage", "spark_compaction"},
    "client": {"wire", "client"},
}
# libraries that do I/O or keep time of their own, which the I/O-free layers must not touch
IO_LIBRARIES = {"asyncio", "socket", "rocksdict", "aiobotocore", "pyarrow", "structlog"}


def _layer_of(module: str) -> str | None:
    """`headwater.server.broker` -> server; `headwater.client` -> client; others -> None."""
    parts = module.split(".")
    if parts[0] != "headwater":
        return None
    if len(parts) == 1:
        return "client"
    return parts[1] if parts[1] in LAYERS else "client"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def _modules() -> list[tuple[str, Path]]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if len(relative.parts) == 1:
            if path.stem in ENTRY_POINTS:
                continue
            modules.append(("client", path))
        else:
            modules.append((relative.parts[0], path))
    return modules


def test_every_layer_imports_only_what_its_row_allows() -> None:
    modules = _modules()
    assert {layer for layer, _ in modules} == {*LAYERS, "client"}
    violations = [
        f"{path.relative_to(PACKAGE.parent)} ({layer}) imports {name}"
        for layer, path in modules
        for name in _imports(path)
        if (target := _layer_of(name)) is not None and target not in ALLOWED[layer]
    ]
    assert violations == []


def test_wire_and_durables_do_no_io() -> None:
    violations = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for layer, path in _modules()
        if layer in ("wire", "durables")
        for name in _imports(path)
        if name.split(".")[0] in IO_LIBRARIES
    ]
    assert violations == []


def test_a_violation_is_seen(tmp_path: Path) -> None:
    """The checker itself: a durables module importing the server is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from headwater.server import broker\n")
    assert "headwater.server" in _imports(bad)
    assert _layer_of("headwater.server") not in ALLOWED["durables"]
    assert _layer_of("headwater.producer") == "client"
    assert _layer_of("headwater") == "client"


def test_no_module_is_over_500_lines() -> None:
    """Small modules with one job each: a module that outgrows 500 lines gets split."""
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
