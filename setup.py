"""One top-level package, `pagedserve`, laid out as it imports: `pagedserve/` holds the engine and
tracked symlinks to the repository's top-level folders (`services/`, `shared/`, `kernels/`, `ops/`,
the deployment layout), so editors and type checkers follow `pagedserve.services.*` to its file.

`kernels/` has no `__init__.py` (a namespace package): from the repository root, where Python puts
the working directory on `sys.path`, a bare `import kernels` must reach Hugging Face's `kernels`
distribution (transformers imports it), not this folder. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

# find_packages follows the symlinks but stops at a folder without __init__.py: kernels/ is named.
packages = ["pagedserve", *(f"pagedserve.{p}" for p in find_packages("pagedserve"))]
packages += ["pagedserve.kernels", *(f"pagedserve.kernels.{p}" for p in find_packages("kernels"))]

setup(packages=packages)
