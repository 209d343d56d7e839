"""Where `pagedserve up --ray` puts the services and which addresses they use (no cluster needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pagedserve.ops.cli import command as cli
from pagedserve.ops.deploy.ray_placement import (
    ActorResources,
    RayPlacement,
    actor_resources,
    parse_worker_resources,
    placed_config,
    routable,
    worker_config,
)
from pagedserve.shared.config import ServeConfig


def test_worker_resources_are_a_json_object_of_amounts() -> None:
    assert parse_worker_resources('{"GPU": 1, "pagedserve_worker": 0.5}') == {
        "GPU": 1.0,
        "pagedserve_worker": 0.5,
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("GPU=1", "JSON object"),
        ("[1]", "non-empty JSON object"),
        ("{}", "non-empty"),
        ('{"GPU": -1}', "'GPU'"),
    ],
)
def test_bad_worker_resources_are_one_error_naming_the_flag(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="--ray-worker-resources") as e:
        parse_worker_resources(text)
    assert says in str(e.value)


def test_cpus_and_gpus_are_actor_options_and_the_rest_custom_resources() -> None:
    assert actor_resources({"CPU": 2, "GPU": 1, "pagedserve_worker": 1}) == ActorResources(
        2, 1, {"pagedserve_worker": 1}
    )


def test_a_worker_asking_only_for_a_custom_resource_holds_no_cpu() -> None:
    assert actor_resources({"pagedserve_worker": 1}).num_cpus == 0


def test_a_cpu_worker_runs_as_many_threads_as_cpus_it_was_given() -> None:
    assert worker_config(ServeConfig(), {"CPU": 4}).num_threads == 4
    assert worker_config(ServeConfig(num_threads=2), {"CPU": 4}).num_threads == 2  # the user chose


def test_a_gpu_worker_runs_on_cuda_unless_the_user_chose_a_device() -> None:
    assert worker_config(ServeConfig(), {"GPU": 1}).device == "cuda"
    assert worker_config(ServeConfig(device="cpu"), {"GPU": 1}).device == "cpu"


def test_on_one_machine_the_endpoints_stay_on_loopback() -> None:
    config = ServeConfig()

    placed = placed_config(config, "10.0.0.5", ["10.0.0.5", "10.0.0.5", "10.0.0.5"])

    assert placed.worker_endpoint == config.worker_endpoint == "tcp://127.0.0.1:5556"


def test_across_machines_local_endpoints_move_to_the_core_nodes_ip() -> None:
    config = ServeConfig(front_endpoint="tcp://0.0.0.0:6000", block_manager_endpoint="tcp://10.9.9.9:6002")

    placed = placed_config(config, "10.0.0.5", ["10.0.0.5", "10.0.0.6"])

    assert placed.front_endpoint == "tcp://10.0.0.5:6000"
    assert placed.worker_endpoint == "tcp://10.0.0.5:5556"
    assert placed.block_manager_endpoint == "tcp://10.9.9.9:6002"  # given routable: kept


def test_an_ipv6_core_node_is_bracketed() -> None:
    assert routable("tcp://127.0.0.1:5556", "fd00::5") == "tcp://[fd00::5]:5556"


def test_auto_lets_ray_find_or_start_a_cluster() -> None:
    assert RayPlacement("auto").ray_init_address is None
    assert RayPlacement("10.0.0.5:6379").ray_init_address == "10.0.0.5:6379"


def test_up_and_serve_take_the_ray_flags() -> None:
    parser = cli.build_parser()
    up = parser.parse_args(["up", "--ray", "auto", "--ray-worker-resources", '{"GPU": 1}'])
    serve = parser.parse_args(["serve", "m", "--ray", "10.0.0.5:6379"])

    assert (up.ray, up.ray_worker_resources, serve.ray) == ("auto", '{"GPU": 1}', "10.0.0.5:6379")


def test_worker_resources_without_ray_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["up", "--ray-worker-resources", '{"GPU": 1}']) == 2
    assert "--ray-worker-resources needs --ray" in capsys.readouterr().err


def test_bad_worker_resources_stop_up_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["up", "--ray", "auto", "--ray-worker-resources", "GPU"]) == 2
    assert "must be a JSON object" in capsys.readouterr().err


def test_the_default_path_never_imports_ray() -> None:
    code = (
        "import sys\n"
        "from pagedserve.ops.cli import command\n"
        "from pagedserve.ops.deploy import up, supervisor, ray_placement\n"
        "command.build_parser().parse_args(['up', '--workers', '2'])\n"
        "print('ray' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )

    assert result.stdout.strip() == "False"
