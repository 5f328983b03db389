"""The architecture of docs/ARCHITECTURE.md, checked on the source: every `import` of every module
(inside functions and `TYPE_CHECKING` blocks too) is parsed; a package may import only the packages
its row allows, no two modules import each other however indirectly, and every module the document
names exists. The command-line entry points that reach the server or Spark (`cli.serve_command`,
`cli.main` for the version, `cli.compact_command`, `cli.token_commands` for the tokens file,
`cli.cluster_commands` reading etcd) are the one exception to the CLI's row."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "headwater"
PACKAGES = ("wire", "storage", "durables", "server", "client", "cli", "spark_compaction")
ENTRY_POINTS = {
    "headwater.cli.main",
    "headwater.cli.serve_command",
    "headwater.cli.compact_command",
    "headwater.cli.token_commands",
    "headwater.cli.cluster_commands",
}

ALLOWED = {
    "wire": {"wire"},
    "storage": {"wire", "storage"},
    "durables": {"wire", "durables"},
    "server": {"wire", "storage", "durables", "server"},
    "client": {"wire", "client"},
    "cli": {"wire", "client", "cli"},
    "spark_compaction": {"wire", "storage", "client", "spark_compaction"},
}
# Inside the server, packages by concept, each importing only packages of a lower rank (and its
# own); "" is the server's own folder (config, logs, reply, turns...), `serve` its composition root
SERVER_RANKS = {
    "": 0,
    "topics": 1,
    "security": 1,
    "schemas": 2,
    "subscriptions": 2,
    "catalog": 3,
    "requests": 4,
    "net": 5,
    "cluster": 6,
    "kafka": 6,
    "ops": 7,
    "serve": 8,
}

# libraries that do I/O or keep time of their own, which the I/O-free layers must not touch
IO_LIBRARIES = {"asyncio", "socket", "rocksdict", "aiobotocore", "pyarrow", "structlog"}


def _package_of(module: str) -> str | None:
    """`headwater.server.requests.broker` -> server; `headwater` (the public client names, and
    `headwater.testing`) -> client; modules outside the project -> None."""
    parts = module.split(".")
    if parts[0] != "headwater":
        return None
    if len(parts) == 1 or parts[1] not in PACKAGES:
        return "client"
    return parts[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[str]:
    """Every module a file imports: `from a.b import c` counts as a.b, and as a.b.c when that is
    a module of ours (an import of a package also runs its `__init__`)."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found.extend(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in MODULES
            )
    return found


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_package_imports_only_what_its_row_allows() -> None:
    assert {_package_of(name) for name in MODULES} == set(PACKAGES)
    violations = [
        f"{name} ({package}) imports {imported}"
        for name, path in MODULES.items()
        if name not in ENTRY_POINTS and name != "headwater.__main__"
        for imported in _imports(path)
        if (package := _package_of(name)) is not None
        and (target := _package_of(imported)) is not None
        and target not in ALLOWED[package]
    ]
    assert violations == []


def _server_package(module: str) -> str:
    """`headwater.server.requests.broker` -> requests; `headwater.server.config` -> "";
    `headwater.server.serve` -> serve."""
    rest = module.split(".")[2:]
    if len(rest) >= 2 or (rest and rest[0] in SERVER_RANKS):
        return rest[0]
    return ""


def test_server_packages_import_only_lower_ones() -> None:
    servers = [name for name in MODULES if name.startswith("headwater.server.")]
    assert {_server_package(name) for name in servers} == set(SERVER_RANKS)
    violations = [
        f"{name} ({own}) imports {imported} ({theirs})"
        for name in servers
        for imported in _imports(MODULES[name])
        if imported.startswith("headwater.server.")
        and (own := _server_package(name)) != (theirs := _server_package(imported))
        and SERVER_RANKS[theirs] >= SERVER_RANKS[own]
    ]
    assert violations == []


def test_wire_and_durables_do_no_io() -> None:
    violations = [
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if _package_of(name) in ("wire", "durables")
        for imported in _imports(path)
        if imported.split(".")[0] in IO_LIBRARIES
    ]
    assert violations == []


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a package's `__init__` counts as a module)."""
    return {
        name: {imported for imported in _imports(path) if imported in MODULES} - {name}
        for name, path in MODULES.items()
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    """No module reaches itself through imports, `TYPE_CHECKING` ones included: a circle closed
    through a type-only import is still two concepts that cannot be understood apart. Importing
    names from a package counts as importing its `__init__`."""
    assert _circles(_graph()) == []


def test_a_circle_and_a_violation_are_seen(tmp_path: Path) -> None:
    """The checkers themselves."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from headwater.server import requests\n")
    assert "headwater.server" in _imports(bad)
    assert "headwater.server.requests" in _imports(bad)
    assert _package_of("headwater.server") not in ALLOWED["durables"]
    assert _package_of("headwater.client.producer") == "client"
    assert _package_of("headwater") == "client"
    assert _package_of("headwater.testing") == "client"


def test_every_module_the_architecture_names_exists() -> None:
    """docs/ARCHITECTURE.md names modules by path (`headwater/server/requests/broker.py`) and
    packages by folder: each one named must exist, so the document cannot drift from the code."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"headwater/[\w/]+(?:\.py)?", text))
    assert named, "docs/ARCHITECTURE.md names no module"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == []


def test_every_package_says_what_lives_there() -> None:
    """Each package's `__init__` starts with a docstring naming its modules: every module is at
    most two clicks from its package's docstring."""
    unnamed = []
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert doc, f"{init.relative_to(ROOT)} has no docstring"
        for module in init.parent.glob("*.py"):
            if module.name != "__init__.py" and f"`{module.stem}`" not in doc:
                unnamed.append(str(module.relative_to(ROOT)))
    assert unnamed == []


def test_the_server_starts_without_the_client_or_the_compaction_jobs_libraries() -> None:
    """`headwater serve` goes to cli/serve_command.py, and `headwater/__init__` imports the
    client's names on first use: a server's start-up imports no client module. pyarrow (0.4 s of
    CPU to import) is imported when a snapshot file is read or written, and pyspark only by the
    job (storage/snapshot_schema.py)."""
    probe = (
        "import sys, headwater.cli.entry, headwater.cli.serve_command, headwater.server.serve, "
        "headwater.server.cluster.cluster_mode; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'pyspark') "
        "or m.startswith('headwater.client')))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


def test_the_client_names_are_there_when_first_used() -> None:
    """`headwater`'s lazy names: each one its module's object, in `dir()` and `__all__`, and an
    unknown one an AttributeError."""
    import headwater
    from headwater.client.client import Client, connect
    from headwater.client.producer import Producer

    assert (headwater.Client, headwater.connect, headwater.Producer) == (Client, connect, Producer)
    assert {"Client", "connect", "MessageBatch", "Compression"} <= set(dir(headwater))
    assert all(hasattr(headwater, name) for name in headwater.__all__)
    try:
        headwater.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("an unknown name was found")


def test_every_logger_is_named_after_its_module() -> None:
    """Server code logs under `headwater.server.*`, the client under `headwater.client.*`, each
    module under its own name: a logger named by hand drifts (server modules logged as
    `headwater.client.credentials`, client modules all as `headwater.client.client`)."""
    # a module's own logger (the CLI may configure the library's, by their names)
    named = re.compile(
        r"^\s*(?:self\.)?_?log(?:ger)?\s*(?::[^=]*)?=\s*"
        r"(?:structlog\.get_logger|logging\.getLogger)\(\s*(?!__name__\s*\))"
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "headwater").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if named.search(line)
    ]
    assert offenders == []
