"""The `pagedserve` command: run one service, a whole local deployment, or talk to one.

    pagedserve block-manager | scheduler | worker | api [flags]    one service (docker compose runs these)
    pagedserve up [--workers N] [--no-api] [config flags]          all of them, supervised
    pagedserve serve [MODEL] [same flags as up]                    the same as up, the model first
    pagedserve up --ray ADDRESS|auto [--ray-worker-resources JSON]  the same, as actors on a Ray cluster
    pagedserve demo ["question"]                                   up + one answer from the bundled model + down
    pagedserve generate "prompt"                                   ask a running deployment
    pagedserve health [--url URL] [--json] [--watch]               the block manager's /blocks, readable
    pagedserve top                                                 pool, requests, workers, live in the terminal
    pagedserve keys --dir DIR                                      CURVE key pairs for encrypted ZeroMQ
    pagedserve bench | chaos ...                                   benchmarks and fault injection

Config flags (`--block-size 32`, ...) and `PAGEDSERVE_*` variables set the same `ServeConfig`.
Heavy imports (torch, the SDK, rich) happen inside the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from pagedserve.shared.config import ServeConfig, add_config_args, command_fields, config_from_args

if TYPE_CHECKING:
    from pagedserve.ops.deploy.ray_placement import RayPlacement

SERVICES = {
    "block-manager": "pagedserve.services.block_manager.service",
    "scheduler": "pagedserve.services.scheduler.service",
    "worker": "pagedserve.services.worker.service",
    "api": "pagedserve.services.api.server",
    "router": "pagedserve.services.router.service",
}
# Subcommands whose arguments belong to a module another part of the project owns.
PASSTHROUGH = {"bench": "pagedserve.ops.bench", "chaos": "pagedserve.ops.chaos"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedserve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name in SERVICES:
        p = sub.add_parser(name, help=f"run the {name.replace('-', ' ')} service until SIGTERM")
        add_config_args(p, command_fields(name))
        p.add_argument(
            "--failpoints",
            metavar="SPEC",
            default=None,
            help="test deployments only: arm named faults in this process, e.g. "
            "'worker.drop_execute=3*off->1*return' (docs/failure-model.md lists them)",
        )
        if name == "worker":
            p.add_argument(
                "--standby",
                action="store_true",
                help="load the model, then wait on stdin for the name of a dead worker to become "
                "(the supervisor keeps one warm: services/worker/standby.py)",
            )
        if name == "api":
            p.add_argument(
                "--standby",
                action="store_true",
                help="build the app, then wait on stdin to take a dead API process's place "
                "(the supervisor keeps one warm: services/api/standby.py)",
            )
        p.set_defaults(handler=_cmd_service)

    for name in ("up", "serve"):
        p = sub.add_parser(
            name,
            help="run block manager, scheduler, workers and the OpenAI API as supervised local processes",
        )
        if name == "serve":
            p.add_argument("served_model", nargs="?", default=None, metavar="MODEL", help="as --model")
        p.add_argument(
            "--workers", type=int, default=1, help="worker processes, named worker-0..N-1 (default: 1)"
        )
        p.add_argument(
            "--schedulers",
            type=int,
            default=1,
            help="scheduler shards, each with its own block manager and --workers workers, behind "
            "`pagedserve router` on the front endpoint (default: 1, no router)",
        )
        p.add_argument(
            "--api",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="also run the OpenAI-compatible HTTP API (default: on)",
        )
        _add_ready_timeout(p)
        p.add_argument(
            "--log-dir", type=Path, default=None, help="one <service>.log per child (default: this terminal)"
        )
        _add_ray_args(p)
        add_config_args(p)
        p.set_defaults(handler=_cmd_up)

    p = sub.add_parser("demo", help="start everything on the bundled model, answer one question, stop")
    p.add_argument("prompt", nargs="?", default=None, help="the question (default: a short factual one)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    _add_ready_timeout(p)
    add_config_args(p)
    p.set_defaults(handler=_cmd_demo)

    p = sub.add_parser("generate", help="send one prompt to a running deployment and print the completion")
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument(
        "--endpoint", default=None, help="scheduler front endpoint (default: config front_endpoint)"
    )
    p.add_argument(
        "--keys-dir", default=None, help="CURVE keys from `pagedserve keys` (default: config curve_keys_dir)"
    )
    p.add_argument(
        "--stream", action=argparse.BooleanOptionalAction, default=True, help="print tokens as they come"
    )
    p.set_defaults(handler=_cmd_generate)

    p = sub.add_parser("health", help="show the block manager's /blocks: pools, blocks, leases, invariants")
    p.add_argument(
        "--url", default=None, help="block manager ops URL (default: from config, http://127.0.0.1:8081)"
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument("--all", action="store_true", help="one row per block, even in big pools")
    p.add_argument("--max-rows", type=int, default=200, help="rows per table before eliding")
    p.add_argument("--watch", action="store_true", help="refresh in place: the same as `pagedserve top`")
    p.set_defaults(handler=_cmd_health)

    p = sub.add_parser(
        "top", help="the live view in the terminal: pool occupancy, requests, workers, tok/s, faults"
    )
    p.add_argument("--scheduler-url", default=None, help="scheduler ops URL (default: from config, :8080)")
    p.add_argument(
        "--block-manager-url", default=None, help="block manager ops URL (default: from config, :8081)"
    )
    p.add_argument(
        "--token", default=None, help="the admin token, if one is set (default: config admin_token)"
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)")
    p.add_argument(
        "--once",
        action="store_true",
        help="print one frame and exit (1 if invariants are broken, 2 if nothing could be read)",
    )
    p.set_defaults(handler=_cmd_top)

    p = sub.add_parser("keys", help="create CURVE key pairs (server, client, authorized/) in a folder")
    p.add_argument("--dir", type=Path, required=True, help="folder to write; point curve_keys_dir at it")
    p.add_argument("--force", action="store_true", help="replace existing keys")
    p.set_defaults(handler=_cmd_keys)

    for name, module in PASSTHROUGH.items():
        p = sub.add_parser(name, help=f"{module}: its own flags (pagedserve {name} --help)", add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return run_passthrough(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except ValidationError as e:
        print(f"pagedserve {args.command}: invalid configuration:\n{e}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------- services


def _cmd_service(args: argparse.Namespace) -> int:
    # `kill -USR1 <pid>` prints every thread's Python stack to the service's log: what a step that
    # never answers (its heartbeat thread still beating) is stuck on.
    config = config_from_args(args)
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    if args.failpoints:
        from pagedserve.shared import failpoints

        try:
            failpoints.configure(args.failpoints)
        except ValueError as e:
            print(f"pagedserve {args.command}: --failpoints: {e}", file=sys.stderr)
            return 2
        print(f"pagedserve {args.command}: failpoints armed: {args.failpoints}", file=sys.stderr, flush=True)
    if args.command == "worker":
        config = _with_worker_id(config)
        refusal = dtype_refusal(config)
        if refusal:  # once, clearly, and exit: a model that cannot run here is not retried
            print(f"pagedserve worker: {refusal}", file=sys.stderr)
            return 2
    module = importlib.import_module(SERVICES[args.command])
    if getattr(args, "standby", False):
        module.run(config, standby=True)
    else:
        module.run(config)
    return 0


def _with_worker_id(config: ServeConfig) -> ServeConfig:
    """In a container: name an unnamed worker after its container (see ops/deploy/worker_identity.py),
    and leave the name where the compose healthcheck looks for its pool."""
    from pagedserve.ops.deploy import worker_identity

    if not worker_identity.in_container():
        return config
    if config.worker_id is None:
        config.worker_id = worker_identity.container_worker_id()
    id_file = worker_identity.worker_id_file()
    id_file.parent.mkdir(parents=True, exist_ok=True)
    id_file.write_text(config.worker_id)
    return config


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ray",
        metavar="ADDRESS|auto",
        default=None,
        help="run every service as an actor on a Ray cluster (host:port of its head; auto = RAY_ADDRESS, "
        "else the cluster last started here, else a local one for this run); needs pagedserve[ray]",
    )
    p.add_argument(
        "--ray-worker-resources",
        metavar="JSON",
        default=None,
        help="what each worker asks Ray for, e.g. '{\"GPU\": 1}' or '{\"pagedserve_worker\": 1}'; "
        'workers are spread over the nodes that have it (default: {"CPU": 1})',
    )


def _ray_placement(args: argparse.Namespace) -> RayPlacement | None:
    """The --ray flags as a RayPlacement (None without --ray); ValueError naming the flag."""
    from pagedserve.ops.deploy.ray_placement import (
        DEFAULT_WORKER_RESOURCES,
        RayPlacement,
        parse_worker_resources,
    )

    if args.ray is None:
        if args.ray_worker_resources is not None:
            raise ValueError("--ray-worker-resources needs --ray")
        return None
    resources = parse_worker_resources(args.ray_worker_resources or DEFAULT_WORKER_RESOURCES)
    if importlib.util.find_spec("ray") is None:
        raise ValueError("--ray needs Ray: pip install 'pagedserve[ray]'")
    return RayPlacement(args.ray, resources)


def dtype_refusal(config: ServeConfig) -> str | None:
    """Why this machine's workers would refuse the configured dtype, or None (torch is imported only
    for a dtype that may be refused)."""
    if config.simulate_step_ms is not None or config.dtype not in ("bfloat16", "float16"):
        return None
    from pagedserve.services.worker.cpu_dtype import UnsupportedDtype, check_cpu_dtype

    try:
        check_cpu_dtype(config.dtype, config.device)
    except UnsupportedDtype as e:
        return str(e)
    return None


def _cmd_up(args: argparse.Namespace) -> int:
    from pagedserve.ops.deploy.supervisor import resolve_model_first
    from pagedserve.ops.deploy.up import run_up
    from pagedserve.services.checkpoint import served_name
    from pagedserve.shared.log import configure_logging

    try:
        ray = _ray_placement(args)
    except ValueError as e:
        print(f"pagedserve {args.command}: {e}", file=sys.stderr)
        return 2
    model = getattr(args, "served_model", None)
    config = config_from_args(args, **({"model": model} if model else {}))
    configure_logging("supervisor", config.log_format, config.log_level)
    try:
        if args.api and config.served_model_name is None:
            # The API is named after the model as the user gave it, not the resolved cache folder.
            config = config.model_copy(update={"served_model_name": served_name(config.model)})
        config = resolve_model_first(config)
    except ValueError as e:  # no such checkpoint folder: say so before starting anything
        print(f"pagedserve {args.command}: {e}", file=sys.stderr)
        return 2
    refusal = dtype_refusal(config)
    if refusal:  # before any worker starts: a worker that cannot load would be restarted forever
        print(f"pagedserve {args.command}: {refusal}", file=sys.stderr)
        return 2
    return run_up(
        config,
        args.workers,
        args.ready_timeout,
        args.log_dir,
        api=args.api,
        ray=ray,
        schedulers=args.schedulers,
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from pagedserve.ops.cli.demo import DEFAULT_PROMPT, run_demo
    from pagedserve.shared.log import configure_logging

    config = config_from_args(args)
    configure_logging("supervisor", config.log_format, "warning")  # the terminal is for the answer
    return run_demo(config, args.prompt or DEFAULT_PROMPT, args.max_tokens, args.ready_timeout, args.stream)


def _add_ready_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the scheduler's /readyz (default: 300)",
    )


# ---------------------------------------------------------------- clients of a running deployment


def _cmd_generate(args: argparse.Namespace) -> int:
    from pagedserve.ops.cli.generate import generate_text

    config = ServeConfig()
    try:
        generate_text(
            args.endpoint or config.front_endpoint,
            args.prompt,
            sys.stdout,
            args.stream,
            keys_dir=args.keys_dir or config.curve_keys_dir,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
    except Exception as e:  # noqa: BLE001 - the CLI boundary: one line, non-zero exit
        print(f"pagedserve generate: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_top(args: argparse.Namespace) -> int:
    from pagedserve.ops.cli.top import run_top
    from pagedserve.ops.deploy.endpoints import ops_url

    config = ServeConfig()
    return run_top(
        (args.scheduler_url or ops_url(config, config.scheduler_ops_port)).rstrip("/"),
        (args.block_manager_url or ops_url(config, config.block_manager_ops_port)).rstrip("/"),
        args.token or config.admin_token,
        args.interval,
        once=args.once,
    )


def _cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the invariants hold, 1 when any is broken, 2 when /blocks cannot be read."""
    from pagedserve.ops.deploy import ops_client

    if args.url is None:
        from pagedserve.ops.deploy.endpoints import ops_url

        config = ServeConfig()
        args.url = ops_url(config, config.block_manager_ops_port)
    if args.watch:
        from pagedserve.ops.cli.top import run_top
        from pagedserve.ops.deploy.endpoints import ops_url

        config = ServeConfig()
        return run_top(
            ops_url(config, config.scheduler_ops_port), args.url.rstrip("/"), config.admin_token, 1.0
        )
    url = args.url.rstrip("/") + "/blocks"
    try:
        dump = ops_client.get_json(url)
    except (OSError, ValueError) as e:
        print(f"pagedserve health: cannot read {url}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(dump, indent=2))
    else:
        from pagedserve.ops.cli.health_view import print_blocks

        print_blocks(dump, show_all=args.all, max_rows=args.max_rows)
    return 0 if dump.get("invariants", {}).get("ok", False) else 1


def _cmd_keys(args: argparse.Namespace) -> int:
    from pagedserve.ops.cli.keys import create_keys

    try:
        paths = create_keys(args.dir, force=args.force)
    except FileExistsError as e:
        print(f"pagedserve keys: {e}", file=sys.stderr)
        return 1
    for role, path in paths.items():
        print(f"{role:14} {path}")
    print(f"set PAGEDSERVE_CURVE_KEYS_DIR={args.dir} (secrets are mode 0600: keep them off shared volumes)")
    return 0


# ---------------------------------------------------------------- bench, chaos


def run_passthrough(
    command: str, argv: list[str], import_module: Callable[[str], object] = importlib.import_module
) -> int:
    module_name = PASSTHROUGH[command]
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name not in (module_name, "pagedserve.ops"):
            raise  # the module exists but one of its own imports is missing: show that
        print(f"pagedserve {command}: {module_name} is not available in this install", file=sys.stderr)
        return 2
    result = module.main(argv)  # type: ignore[attr-defined]
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
