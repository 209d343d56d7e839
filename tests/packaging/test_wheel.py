"""The wheel as a user gets it: one top-level package, `pagedserve`, that works installed on its own.

The repository keeps services/, shared/, kernels/ and ops/ at its top; setup.py maps each to
`pagedserve.<folder>`. Built once per module from a copy of the sources (an in-tree build would write
build/ and *.egg-info into the working tree), installed with --no-deps into a fresh virtual environment
that sees this interpreter's site-packages through a .pth line (so torch and friends are not installed
twice, and the editable install's finder there is not run). Every check runs from a temporary cwd with
`python -I`: neither the repository nor PYTHONPATH is on sys.path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("services", "shared", "kernels", "ops")
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "pagedserve", *FOLDERS)


@dataclass(slots=True)
class Installed:
    wheel: Path
    python: Path
    bin: Path
    cwd: Path

    def run(self, *argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv], cwd=self.cwd, capture_output=True, text=True, timeout=120, check=False
        )

    def python_code(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.python, "-I", "-c", code)


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in BUILD_INPUTS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    src, dist, env, cwd = root / "src", root / "dist", root / "venv", root / "cwd"
    for d in (src, dist, cwd):
        d.mkdir()
    _copy_sources(src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = ["wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(dist), str(src)]
    subprocess.run(pip + build, check=True, capture_output=True, timeout=120)
    (wheel,) = dist.glob("pagedserve-*.whl")

    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    env_site = Path(
        subprocess.run(
            [python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # A plain path line: the dependencies become importable, their own .pth files are not processed.
    (env_site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = ["--python", str(python), "install", "--no-deps", "--no-index", "--quiet", str(wheel)]
    subprocess.run(pip + install, check=True, capture_output=True, timeout=120)
    return Installed(wheel=wheel, python=python, bin=env / "bin", cwd=cwd)


def test_the_wheel_holds_exactly_one_top_level_package_pagedserve(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = whl.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
        declared = whl.read(top_level).decode().split() if top_level else ["pagedserve"]

    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}

    assert tops == {"pagedserve"}
    assert declared == ["pagedserve"]


def test_the_wheel_holds_every_python_file_of_the_source_folders(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        in_wheel = {n for n in whl.namelist() if n.endswith(".py")}
    expected = {
        f"pagedserve/{p.relative_to(REPO).as_posix()}" for f in FOLDERS for p in (REPO / f).rglob("*.py")
    }
    # pagedserve/ itself: the package root (__init__.py) and what lives there (the in-process engine)
    expected |= {p.relative_to(REPO).as_posix() for p in (REPO / "pagedserve").rglob("*.py")}

    assert sorted(expected - in_wheel) == []
    assert sorted(in_wheel - expected) == []


def test_installed_pagedserve_imports_from_the_environment_not_the_repository(installed: Installed) -> None:
    result = installed.python_code(
        "import pagedserve.ops.cli, pagedserve.kernels; print(pagedserve.__file__)"
    )

    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed.python.parents[1])


@pytest.mark.parametrize("folder", FOLDERS)
def test_installed_wheel_has_no_bare_top_level_folder_package(installed: Installed, folder: str) -> None:
    # A bare name is importable only where another distribution owns it (transformers needs
    # Hugging Face's `kernels`): never from this wheel.
    owners = installed.python_code(
        f"import importlib.metadata as m; print(*m.packages_distributions().get({folder!r}, []))"
    )
    result = installed.python_code(f"import {folder}")

    assert owners.returncode == 0, owners.stderr
    assert "pagedserve" not in owners.stdout.split()
    if not owners.stdout.strip():
        assert result.returncode != 0
        assert f"No module named '{folder}'" in result.stderr


def test_installed_wheel_exposes_the_public_api(installed: Installed) -> None:
    code = (
        "import sys\n"
        "from pagedserve import Client, AsyncClient, LLM, SamplingParams\n"
        "assert SamplingParams(max_tokens=3).max_tokens == 3\n"
        "for c in (Client, AsyncClient, LLM, SamplingParams):\n"
        "    print(c.__name__, sys.modules[c.__module__].__file__)\n"
    )
    result = installed.python_code(code)

    assert result.returncode == 0, result.stderr
    found = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert sorted(found) == ["AsyncClient", "Client", "LLM", "SamplingParams"]
    assert all(Path(f).is_relative_to(installed.python.parents[1]) for f in found.values()), found


def test_installed_console_script_runs(installed: Installed) -> None:
    result = installed.run(installed.bin / "pagedserve", "--help")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: pagedserve")
    for command in ("block-manager", "scheduler", "worker", "up", "demo", "bench", "chaos"):
        assert command in result.stdout
