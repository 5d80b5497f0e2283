"""The core reader never imports the reader service; only the composition root (``reader.api``) names it."""

import ast
import json
import pathlib
import subprocess
import sys

import reader
from tests import helpers

READER = pathlib.Path(reader.__file__).parent
COMPOSITION_ROOT = "api.py"  # picks ServiceSource when service= is given, importing it only then


def service_imports(path: pathlib.Path) -> list[str]:
    """Every import of ``reader.service`` in ``path``, at any depth (a lazy import inside a function counts)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [f"{path.name}:{node.lineno} {name}" for name in names if name.startswith("reader.service")]
    return found


def test_no_core_module_but_the_composition_root_imports_the_service():
    core = sorted(p for p in READER.rglob("*.py") if p.name != COMPOSITION_ROOT and "service" not in p.parts)
    assert len(core) > 10 and (READER / COMPOSITION_ROOT).exists()
    assert [line for path in core for line in service_imports(path)] == []
    assert service_imports(READER / COMPOSITION_ROOT), "the root picks the service source: the check above sees it"


def test_importing_the_core_loads_no_service_module():
    program = (
        "import json, sys\n"
        "import reader.dataset, reader.source, reader.core.state, reader.core.iterator, reader.api\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('reader'))))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=helpers.cli_env(), check=True, timeout=120
    )
    loaded = json.loads(completed.stdout)
    assert "reader.dataset" in loaded and "reader.api" in loaded
    assert [m for m in loaded if m.startswith("reader.service")] == []
