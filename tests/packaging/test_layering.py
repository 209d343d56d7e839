"""The layers, read off the imports of every source file (with `ast`, lazy imports inside functions too).

    ops        may import anything of pagedserve
    engine     (pagedserve/engine, the in-process engine) may import services, shared and kernels, never ops
    services   may import shared and kernels, never ops; the scheduler never imports the engine
    shared     imports neither services nor ops
    kernels    imports neither services nor ops

Inside the worker, at run time (imports under `if TYPE_CHECKING:` name types only):

    layers     (worker/layers: attention, MLP, MoE, norms, rope, the linear kinds) import neither
               weights nor models
    models     (worker/models: the architectures) import layers, never weights
    weights    (worker/weights: loading and repacking) may import both

so the three packages form no cycle.

Nothing in the package imports a test module or a bare top-level folder (`shared`, `ops`, ...: the
wheel holds only `pagedserve`), and no source file edits sys.path.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("services", "shared", "kernels", "ops")


@dataclass(frozen=True, slots=True)
class Import:
    where: str  # path:line, for the failure message
    importer: str  # the importing module, pagedserve.<folder>....
    imported: str  # the absolute name of the imported module (or of its package, for `from x import y`)
    type_only: bool = False  # under `if TYPE_CHECKING:`: never imported at run time

    def __str__(self) -> str:
        return f"{self.where} imports {self.imported}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["pagedserve", *parts]) if parts[0] != "pagedserve" else ".".join(parts)


def source_files() -> list[Path]:
    files = sorted(p for p in (REPO / "pagedserve").rglob("*.py") if "__pycache__" not in p.parts)
    for folder in FOLDERS:
        files += sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def imports_of(path: Path) -> Iterator[Import]:
    importer = module_name(path)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    where = path.relative_to(REPO).as_posix()
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(f"{where}:{node.lineno}", importer, alias.name, id(node) in type_only)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield Import(f"{where}:{node.lineno}", importer, module, id(node) in type_only)
            # `from pagedserve.ops import cli` imports the module pagedserve.ops.cli too.
            for alias in node.names:
                yield Import(
                    f"{where}:{node.lineno}", importer, f"{module}.{alias.name}", id(node) in type_only
                )


ALL_IMPORTS = [imp for path in source_files() for imp in imports_of(path)]


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(
    importers: tuple[str, ...], forbidden: tuple[str, ...], run_time_only: bool = False
) -> list[str]:
    """One line per offending import statement (`from a import b` also names a.b: keep the first);
    run_time_only: leave out the imports under `if TYPE_CHECKING:`."""
    found: dict[str, str] = {}
    for imp in ALL_IMPORTS:
        if run_time_only and imp.type_only:
            continue
        if any(within(imp.importer, p) for p in importers) and any(
            within(imp.imported, f) for f in forbidden
        ):
            found.setdefault(imp.where, str(imp))
    return list(found.values())


def test_the_source_files_are_found_and_parsed() -> None:
    importers = {imp.importer.split(".")[1] for imp in ALL_IMPORTS if imp.importer != "pagedserve"}
    assert importers == {*FOLDERS, "engine"}


def test_services_and_the_engine_import_nothing_from_ops() -> None:
    found = violations(("pagedserve.services", "pagedserve.engine"), ("pagedserve.ops",))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("folder", ["shared", "kernels"])
def test_shared_and_kernels_import_nothing_from_services_or_ops(folder: str) -> None:
    found = violations((f"pagedserve.{folder}",), ("pagedserve.services", "pagedserve.ops"))
    assert not found, "\n".join(found)


def test_the_scheduler_does_not_import_the_engine() -> None:
    found = violations(("pagedserve.services.scheduler",), ("pagedserve.engine",))
    assert not found, "\n".join(found)


WORKER = "pagedserve.services.worker"


@pytest.mark.parametrize(
    ("package", "forbidden"), [("layers", ("weights", "models")), ("models", ("weights",))]
)
def test_the_worker_layers_models_and_weights_import_one_way(
    package: str, forbidden: tuple[str, ...]
) -> None:
    found = violations(
        (f"{WORKER}.{package}",), tuple(f"{WORKER}.{f}" for f in forbidden), run_time_only=True
    )
    assert not found, "\n".join(found)


def test_nothing_imports_a_bare_top_level_folder_or_a_test_module() -> None:
    test_modules = {p.stem for p in (REPO / "tests").rglob("*.py")} | {"tests", "conftest"}
    bare = set(FOLDERS) | test_modules
    found = [str(imp) for imp in ALL_IMPORTS if imp.imported.split(".")[0] in bare]

    assert not found, "\n".join(found)


def _edits_sys_path(node: ast.AST) -> bool:
    """sys.path.insert/append/extend(...), sys.path[...] = ..., sys.path = ..., sys.path += ..."""

    def is_sys_path(n: ast.AST) -> bool:
        return (
            isinstance(n, ast.Attribute)
            and n.attr == "path"
            and isinstance(n.value, ast.Name)
            and n.value.id == "sys"
        )

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return is_sys_path(node.func.value) and node.func.attr in ("insert", "append", "extend")
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    return any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets)


def test_no_file_edits_sys_path() -> None:
    files = source_files() + sorted((REPO / "tests").rglob("*.py"))
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if _edits_sys_path(node)
    ]

    assert not found, "\n".join(found)
