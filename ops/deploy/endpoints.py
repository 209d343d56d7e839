"""Where a deployment's services answer, read from its config, and the wait until they do: the
same for local processes (Supervisor), Ray actors (RayDeployment) and anything else that holds a
`config`."""

from __future__ import annotations

import time

from pagedserve.ops.deploy import ops_client
from pagedserve.shared.config import ServeConfig

_ANY_INTERFACE = ("0.0.0.0", "", "::")


def reachable_host(host: str) -> str:
    # A server bound to every interface is still reached on loopback.
    return "127.0.0.1" if host in _ANY_INTERFACE else host


def ops_url(config: ServeConfig, port: int) -> str:
    return f"http://{reachable_host(config.ops_host)}:{port}"


class ConfigEndpoints:
    """The endpoints of `self.config`, for a deployment that has one; `api` says whether it runs the
    API server, `check()` raises while waiting once a service is down for good."""

    config: ServeConfig
    api: bool

    def check(self) -> None:
        raise NotImplementedError

    def ready_log_hint(self) -> str:
        """Where to read why the scheduler is not ready (appended to the timeout's message)."""
        return ""

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.2) -> None:
        """Block until the scheduler's /readyz says 200 (a worker has registered), and the API
        answers if there is one. check()'s error as soon as a core service is down for good,
        TimeoutError after `timeout_s`."""
        url = f"{self.scheduler_ops_url}/readyz"
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            if ops_client.is_ok(url) and (not self.api or ops_client.is_ok(self.api_health_url)):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s{self.ready_log_hint()}")
            time.sleep(poll_s)

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
