"""The one import namespace: the top-level folders install as `pagedserve.<folder>`.

The repository keeps `services/`, `shared/`, `kernels/` and `ops/` at its top (the deployment
layout), while a wheel or an editable install holds exactly one top-level package, `pagedserve`:
nothing generic (`shared`, `ops`) lands in a user's site-packages. Everything else is in
pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = ("services", "shared", "kernels", "ops")

packages = ["pagedserve"] + [f"pagedserve.{sub}" for sub in find_packages("pagedserve")]
for folder in FOLDERS:
    packages += [f"pagedserve.{folder}"] + [f"pagedserve.{folder}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir={"pagedserve": "pagedserve", **{f"pagedserve.{folder}": folder for folder in FOLDERS}},
)
