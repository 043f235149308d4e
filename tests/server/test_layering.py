"""The server reads the agent only through ``nvdaemon.view.AgentView``: no module under ``nvdaemon/server`` (nor the
view) imports ``nvdaemon.app``, not even for typing. Checked on the source (AST), so an import under
``TYPE_CHECKING`` or inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import nvdaemon

PACKAGE = Path(nvdaemon.__file__).parent


def imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, absolute: ``from nvdaemon import app`` and
    ``from .. import app`` in ``nvdaemon.server`` both give ``nvdaemon.app``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def module_imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    return imported_modules(path.read_text(), package)


def test_the_check_sees_every_form_of_import() -> None:
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nvdaemon.app import Agent\n"
    assert "nvdaemon.app" in imported_modules(typing_only, "nvdaemon.server")
    assert "nvdaemon.app" in imported_modules("def f():\n    from .. import app\n", "nvdaemon.server")
    assert "nvdaemon.app" in imported_modules("import nvdaemon.app as a\n", "nvdaemon.server")
    assert "nvdaemon.app" in imported_modules("from . import app\n", "nvdaemon")
    assert "nvdaemon.app" not in imported_modules("from . import app\n", "nvdaemon.server")  # the server's own


def test_nothing_under_server_imports_the_agent() -> None:
    files = [*sorted((PACKAGE / "server").rglob("*.py")), PACKAGE / "view.py"]
    assert len(files) > 10
    agent_module = {"nvdaemon.app"}
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(
            m for m in module_imports(path) if m in agent_module or m.startswith("nvdaemon.app.")
        )
        for path in files
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}
