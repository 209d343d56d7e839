"""`pagedserve up --ray` runs one API actor: asked for several API processes it refuses at once,
naming the setting, instead of serving with fewer than asked (no cluster needed)."""

from __future__ import annotations

import pytest

from pagedserve.ops.deploy.ray_deployment import RayDeployment
from pagedserve.ops.deploy.ray_placement import RayPlacement
from pagedserve.shared.config import ServeConfig


def test_several_api_processes_on_ray_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="api_processes=2: a Ray deployment runs one API actor"):
        RayDeployment(ServeConfig(api_processes=2), 1, placement=RayPlacement("auto"), api=True)


def test_one_api_process_or_none_is_accepted() -> None:
    RayDeployment(ServeConfig(), 1, placement=RayPlacement("auto"), api=True)
    RayDeployment(ServeConfig(api_processes=2), 1, placement=RayPlacement("auto"), api=False)
