"""Where a deployment's services answer, read from its config: the same for local processes
(Supervisor), Ray actors (RayDeployment) and anything else that holds a `config`."""

from __future__ import annotations

from pagedserve.shared.config import ServeConfig

_ANY_INTERFACE = ("0.0.0.0", "", "::")


def reachable_host(host: str) -> str:
    # A server bound to every interface is still reached on loopback.
    return "127.0.0.1" if host in _ANY_INTERFACE else host


def ops_url(config: ServeConfig, port: int) -> str:
    return f"http://{reachable_host(config.ops_host)}:{port}"


class ConfigEndpoints:
    """The endpoints of `self.config`, for a class that has one."""

    config: ServeConfig

    @property
    def front_endpoint(self) -> str:
        return self.config.front_endpoint

    @property
    def scheduler_ops_url(self) -> str:
        return ops_url(self.config, self.config.scheduler_ops_port)

    @property
    def block_manager_ops_url(self) -> str:
        return ops_url(self.config, self.config.block_manager_ops_port)

    @property
    def api_base_url(self) -> str:
        return f"http://{reachable_host(self.config.api_host)}:{self.config.api_port}/v1"

    @property
    def api_health_url(self) -> str:
        return self.api_base_url.removesuffix("/v1") + "/health"
