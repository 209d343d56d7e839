"""The worker's model code keeps its three places apart: layers/ build blocks, models/ compose them,
weights/ fill them. Imports run one way (weights -> models -> layers), so no cycle can form."""

from __future__ import annotations

import ast
from pathlib import Path

import pagedserve.services.worker as worker_package

WORKER = Path(worker_package.__file__).parent
PREFIX = "pagedserve.services.worker."
# A package may import the ones after it in this order, never one before it.
ORDER = ("weights", "models", "layers")


def _runtime_imports(path: Path) -> set[str]:
    """Modules imported at run time (imports under `if TYPE_CHECKING:` are annotations only)."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _package_of(module: str) -> str | None:
    if not module.startswith(PREFIX):
        return None
    head = module.removeprefix(PREFIX).split(".")[0]
    return head if head in ORDER else None


def test_layers_models_and_weights_import_only_downward() -> None:
    wrong = []
    for package in ORDER:
        for path in sorted((WORKER / package).rglob("*.py")):
            for module in _runtime_imports(path):
                target = _package_of(module)
                if target is not None and ORDER.index(target) < ORDER.index(package):
                    wrong.append(f"{path.relative_to(WORKER)} imports {module}")
    assert not wrong, "imports that run upward (weights -> models -> layers only):\n" + "\n".join(wrong)


def test_each_package_holds_modules() -> None:
    for package in ORDER:
        assert [p for p in (WORKER / package).glob("*.py") if p.name != "__init__.py"], package
