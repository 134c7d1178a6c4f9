"""The configuration modules import one way: config reads config_env and
config_retired, and neither of them reads config back (no import cycle)."""

import ast
import pathlib

import hvd_partial

PACKAGE = pathlib.Path(hvd_partial.__file__).parent


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every ``hvd_partial`` module that ``path`` imports, at any level (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.add(node.module or "")
            found.update(alias.name for alias in node.names if not node.module)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hvd_partial."):
            found.add(node.module.removeprefix("hvd_partial."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("hvd_partial.") for a in node.names if a.name.startswith("hvd_partial."))
    return found


def test_config_env_and_config_retired_do_not_import_config():
    assert "config_env" in _imported_modules(PACKAGE / "config.py")
    for name in ("config_env.py", "config_retired.py"):
        imported = _imported_modules(PACKAGE / name)
        assert "config" not in imported, (name, imported)
        assert imported <= {"errors"}, (name, imported)
