"""The project's import graph: no circle anywhere, and no import that runs up a level (docs/architecture.md §4, §5).

The graph is read from the source, every import counted wherever it is
written (inside a function, under ``TYPE_CHECKING``): a lazy import is still a
tie between two floors. ``from package import name`` counts as an import of
the submodule when ``name`` is one.

The reader's floors: ``reader/core`` (the local read engine: NumPy, no
framework, no service) under ``reader/outputs`` (what each framework gets);
``reader/service`` (the servers and the wire) under ``reader/service/client``
(the consumer); the face (``reader/*.py``) composes them, and only its
composition root (``reader/api.py``) names the service. The face exports the
service's options (``reader.ServiceOptions``: plain data, free of gRPC), the one
module of the service's floor it imports.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("reader", "beam_jobs", "schemas")
#: The modules of the reader service that only its servers use: the consumer never imports them.
SERVER_ONLY = {"dispatch_state", "dispatcher", "worker", "worker_streams", "runs", "roots", "__main__"}
#: The service's modules the face imports: ``reader.ServiceOptions`` (what ``service=`` takes) and the names it checks.
FACE_SERVICE_OPTIONS = {"reader.service.options"}
#: What ``import reader`` loads of the service for them: its package (whose servers load when first named), the
#: options and the processing modes they check; no gRPC, no server, no consumer.
LOADED_FOR_SERVICE_OPTIONS = {"reader.service", "reader.service.options", "reader.service.protocol"}


def module_files(packages: tuple[str, ...] = PACKAGES) -> dict[str, pathlib.Path]:
    files = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth of its source (of ``packages``' modules)."""
    files = module_files(packages)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                submodules = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [node.module] + [sub for sub in submodules if sub in files]
                if len(targets) > 1 and all(f"{node.module}.{alias.name}" in files for alias in node.names):
                    targets = targets[1:]  # only submodules named: the package's own code is not what is used
            else:
                continue
            graph[name] |= {target for target in targets if target in files and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
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


def floor(module: str) -> str:
    """Which floor a module is on: core, outputs, server, client, face, snapshots, or another package."""
    parts = module.split(".")
    if parts[0] != "reader":
        return parts[0]
    if len(parts) == 1:
        return "face"
    if parts[1] == "service":
        return "client" if len(parts) > 2 and parts[2] == "client" else "server"
    return parts[1] if parts[1] in ("core", "outputs", "snapshots") else "face"


#: What each floor may import (besides ``schemas``, the contract everything shares).
ALLOWED = {
    "core": {"core"},
    "outputs": {"core", "outputs"},
    "server": {"core", "server"},
    "client": {"core", "server", "client"},
    "snapshots": {"core", "snapshots"},
    "face": {"core", "outputs", "client", "face"},
    "schemas": set(),
    "beam_jobs": {"beam_jobs"},
}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        allowed = ALLOWED[floor(module)] | {"schemas"}
        for target in sorted(targets):
            to = floor(target)
            if to not in allowed and not (floor(module) == "face" and target in FACE_SERVICE_OPTIONS):
                found.append(f"{module} ({floor(module)}) -> {target} ({to})")
            elif floor(module) == "client" and to == "server" and target.split(".")[-1] in SERVER_ONLY:
                found.append(f"{module} (client) -> {target} (a server's own module)")
            elif floor(module) == "face" and to == "client" and module != "reader.api":
                found.append(f"{module} (face) -> {target}: only the composition root, reader.api, picks the service")
    return found


def test_the_graph_sees_the_ties_it_checks():
    graph = import_graph()
    assert len(graph) > 80
    assert "reader.core.blocks" in graph["reader.core.pipeline"]
    assert "reader.service.client" in graph["reader.api"], "a lazy import counts"
    assert "reader.core.block_io" in graph["reader.core.blocks"], "from package import submodule counts"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert upward_imports({"reader.core.plan": {"reader.outputs.adapters"}, "reader.outputs.adapters": set()})
    assert upward_imports(
        {"reader.service.worker": {"reader.service.client.cursor"}, "reader.service.client.cursor": set()}
    )
    assert upward_imports({"reader.api": {"reader.service.dispatcher"}, "reader.service.dispatcher": set()})
    assert not upward_imports({"reader.api": {"reader.service.options"}, "reader.service.options": set()})


#: A subsystem behind one face: modules outside its folder import only the package (its ``__init__``), never
#: its internals, which share a locking protocol of their own.
SUBSYSTEMS = ("reader.core.cache",)


def behind_the_face(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a subsystem's internals from outside its folder."""
    found = []
    for module, targets in sorted(graph.items()):
        for package in SUBSYSTEMS:
            if module == package or module.startswith(f"{package}."):
                continue
            found += [
                f"{module} -> {t} (import {package} instead)" for t in sorted(targets) if t.startswith(f"{package}.")
            ]
    return found


def test_the_shard_cache_is_used_through_its_face():
    # The benches, the harness and the examples too; tests/ test the cache's internals, on purpose.
    assert behind_the_face(import_graph(PACKAGES + ("bench", "testing", "examples"))) == []
    inside = {"reader.core.cache.shard_fill": {"reader.core.cache.chunk_table"}}
    assert behind_the_face(inside | {"reader.core.cache.chunk_table": set()}) == []
    assert behind_the_face({"reader.core.blocks": {"reader.core.cache.shard_fill"}}) == [
        "reader.core.blocks -> reader.core.cache.shard_fill (import reader.core.cache instead)"
    ]
    assert behind_the_face({"reader.core.blocks": {"reader.core.cache"}}) == []


def test_no_import_circle_in_the_project():
    assert cycles(import_graph()) == []


def test_no_import_runs_up_a_floor():
    assert upward_imports(import_graph()) == []


def loaded_modules(program: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-c", f"import json, sys\n{program}\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        env=helpers.cli_env(),
        check=True,
        timeout=120,
    )
    return json.loads(completed.stdout.splitlines()[-1])


def test_importing_the_reader_loads_no_service_and_no_framework():
    loaded = loaded_modules("import reader, reader.dataset, reader.source, reader.core.pipeline, reader.api")
    assert "reader.core.pipeline" in loaded and "reader.api" in loaded
    assert [m for m in loaded if m.startswith("reader.service") and m not in LOADED_FOR_SERVICE_OPTIONS] == []
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "torch", "jax", "grpc")] == []


def test_importing_the_consumer_loads_no_server():
    loaded = loaded_modules("import reader.service.client")
    assert "reader.service.client.source" in loaded
    servers = [m for m in loaded if m.startswith("reader.service.") and m.split(".")[-1] in SERVER_ONLY]
    assert servers == []


def test_a_local_numpy_read_loads_only_pyarrow_numpy_crc32c_and_protobuf(range_root):
    """No pandas (pyarrow's dtype conversions import it: seconds in every reader's first batch) and no framework."""
    loaded = loaded_modules(
        f"import reader\nfor batch in reader.distributed_dataset({str(range_root / 'range8')!r}, 4, seed=0): pass"
    )
    packages = {m.split(".")[0] for m in loaded}
    assert "pandas" not in packages
    assert {"pyarrow", "numpy", "google_crc32c", "google"} <= packages
    assert packages.isdisjoint({"tensorflow", "torch", "jax", "apache_beam", "grpc"})
