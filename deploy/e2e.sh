#!/usr/bin/env bash
# `make e2e`: the retraining chain as one, every step and every training pod a container of this commit's image.
#
# Needs root (apt-get, debootstrap, dockerd) and no registry: a Debian 12 base made with debootstrap from the mirror
# apt uses, the kfloop image built on it from deploy/Dockerfile with a wheelhouse (offline inside the build), then
# tests/e2e_chain.py runs the chain on the KFP test server in multi-user mode (CI through the gateway) and the
# Kubernetes test cluster in a profile namespace (every step a Pod admitted under Pod Security restricted, UID 1000,
# with an s3:// pipeline root; PyTorchJob pods; all containers of the image on the Docker kubelet), against a moto S3
# server and a real `mlflow server`: upload, first training (a second refused while it runs), scheduled drift,
# trigger, a killed training pod, a fire finding the retrain in flight, champion v2, cooldown, an alert through
# `kfloop serve` whose run is cancelled mid-training (its job deleted); every champion rolled out on the cluster's
# KServe (v1 served, v2 a 20% canary promoted, a v3 whose canary fails rolled back), the drift schedule reading the
# requests the predictors logged; it writes e2e-summary.json after every check.
#
# The slow parts are kept in KFLOOP_E2E_CACHE (default /var/tmp/kfloop-e2e) between runs on one machine: the
# docker data root (base image, build layers), the wheelhouse (keyed by the locks). On a cold cache
# the base (debootstrap) and the wheelhouse (pip download, which pip's cache of `make setup` mostly answers) are made
# side by side. `deploy/e2e.sh image` stops once the image is built (.ci/run builds it while the suite runs). Each
# step's time is printed and, when KFLOOP_CI_TIMINGS names a file, appended to it as `e2e:STEP START SECONDS 0`.
set -euo pipefail

main() {
  cd "$(dirname "$0")/.."
  ROOT=$PWD
  CACHE=${KFLOOP_E2E_CACHE:-/var/tmp/kfloop-e2e}
  PYTHON=${E2E_PYTHON:-$ROOT/.venv/bin/python}
  BASE_IMAGE=kfloop-base:bookworm
  COMMIT=$(deploy/image-commit.sh)  # HEAD's SHA, `-dirty` when the tree (the build context) differs from it
  IMAGE=kfloop:${COMMIT:0:12}${COMMIT#"${COMMIT%-dirty}"}
  EXEC_ROOT=/run/kfloop-e2e  # short: dockerd's containerd sockets live here
  export DOCKER_HOST=unix://$CACHE/docker.sock

  MODE=${1:-all}
  [ "$MODE" = all ] || [ "$MODE" = image ] || { echo "usage: deploy/e2e.sh [image]" >&2; exit 2; }
  say() { echo "e2e: $*" >&2; }
  # step NAME: note the start; took NAME [DETAIL]: print and log the step's time
  declare -A started=()
  step() { started[$1]=$EPOCHSECONDS; say "$*"; }
  took() {
    local seconds=$((EPOCHSECONDS - ${started[$1]}))
    say "$1 took $seconds s${2:+ ($2)}"
    [ -z "${KFLOOP_CI_TIMINGS:-}" ] || echo "e2e:$1 ${started[$1]} $seconds 0" >>"$KFLOOP_CI_TIMINGS"
  }

  if [ "$(id -u)" != 0 ]; then
    say "needs root (apt-get, debootstrap, dockerd); run it as root or in CI's container"; exit 1
  fi
  mkdir -p "$CACHE"
  exec 9>"$CACHE/lock"
  flock -n 9 || { say "another make e2e holds $CACHE/lock"; exit 1; }

  missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    step apt-get "${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    took apt-get
  fi

  # The daemon: no bridge, no iptables (containers use the host's loopback), its own socket, roots and pid file.
  step dockerd "data root $CACHE/docker"
  mkdir -p "$CACHE/docker" "$EXEC_ROOT"
  dockerd --host "$DOCKER_HOST" --data-root "$CACHE/docker" --exec-root "$EXEC_ROOT" \
    --pidfile "$CACHE/dockerd.pid" --bridge=none --iptables=false >"$CACHE/dockerd.log" 2>&1 &
  DOCKERD=$!
  stop_dockerd() { kill "$DOCKERD" 2>/dev/null && wait "$DOCKERD" 2>/dev/null || true; }
  trap stop_dockerd EXIT
  for _ in $(seq 120); do
    docker version >/dev/null 2>&1 && break
    kill -0 "$DOCKERD" 2>/dev/null || { tail -20 "$CACHE/dockerd.log" >&2; say "dockerd exited"; exit 1; }
    sleep 0.5
  done
  docker version >/dev/null || { tail -20 "$CACHE/dockerd.log" >&2; say "dockerd did not answer"; exit 1; }
  took dockerd "$(docker info --format '{{.Driver}}') storage"

  # The base: Debian 12 minbase with python3 (3.11) and venv, from the mirror apt is configured with; made in the
  # background while the wheelhouse downloads.
  base_pid=""
  if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    mirror=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
    [ -n "$mirror" ] || mirror=$(sed -n 's/^deb \(\[[^]]*\] \)\?\([^ ]*\/debian\) .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -1)
    [ -n "$mirror" ] || { say "no Debian mirror found in apt's sources"; exit 1; }
    step base "debootstrap bookworm from $mirror"
    make_base() {
      local rootfs
      rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
      debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$mirror" >"$CACHE/debootstrap.log"
      tar -C "$rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
      rm -rf "$rootfs"
      took base "debootstrap and import"
    }
    make_base &
    base_pid=$!
  fi

  # The wheelhouse: every file the image needs, the locks' (hash-checked here and again in the build) and the build
  # backend, downloaded here (pip's mirrors and find-links), installed offline.
  key=$(cat deploy/lock/torch-cpu.txt deploy/lock/runtime.txt pyproject.toml | sha256sum | cut -c1-16)
  wheelhouse=$CACHE/wheelhouse-$key
  if [ ! -e "$wheelhouse/.complete" ]; then
    step wheelhouse "deploy/lock/torch-cpu.txt, deploy/lock/runtime.txt and the build backend"
    mkdir -p "$wheelhouse"
    for previous in "$CACHE"/wheelhouse-*/; do  # wheels kept from the last pins: pip downloads only what changed
      [ "${previous%/}" = "$wheelhouse" ] || { cp -al "$previous". "$wheelhouse/" && rm -rf "$previous"; }
    done
    rm -f "$wheelhouse/.complete"
    # of those, only the files the locks hash stay (a wheel an old cache built from an sdist would fail the build)
    "$PYTHON" - "$wheelhouse" deploy/lock/torch-cpu.txt deploy/lock/runtime.txt <<'PY'
import hashlib, pathlib, re, sys
folder, *locks = sys.argv[1:]
pinned = {h for lock in locks for h in re.findall(r"--hash=sha256:([0-9a-f]{64})", pathlib.Path(lock).read_text())}
for path in pathlib.Path(folder).iterdir():
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() not in pinned:
        path.unlink()
PY
    "$PYTHON" -m pip download -qq -d "$wheelhouse" --require-hashes --no-deps -r deploy/lock/torch-cpu.txt
    # an sdist (kfp-server-api is published as one) stays one: its hash is the locked one; the build makes the wheel
    "$PYTHON" -m pip download -qq -d "$wheelhouse" --require-hashes --no-deps -r deploy/lock/runtime.txt
    "$PYTHON" -m pip download -qq -d "$wheelhouse" "$(sed -n 's/^requires = \["\(.*\)"\]$/\1/p' pyproject.toml)"
    touch "$wheelhouse/.complete"
    took wheelhouse "$(du -sh "$wheelhouse" | cut -f1)"
  fi
  if [ -n "$base_pid" ]; then
    wait "$base_pid" || { tail -20 "$CACHE/debootstrap.log" >&2; say "the base image failed"; exit 1; }
  fi

  # The build context: the working tree's files (tracked and untracked, not ignored) plus the wheelhouse.
  step build "$IMAGE"
  context=$(mktemp -d)
  git ls-files -co --exclude-standard -z | tar --null -T - -c | tar -x -C "$context"
  find "$wheelhouse" -maxdepth 1 \( -name '*.whl' -o -name '*.tar.gz' -o -name '*.zip' \) \
    -exec cp -al -t "$context/deploy/wheelhouse/" {} +
  docker build --quiet -f deploy/Dockerfile -t "$IMAGE" --build-arg PYTHON_IMAGE="$BASE_IMAGE" \
    --build-arg GIT_COMMIT="$COMMIT" "$context" >/dev/null
  rm -rf "$context"
  took build "$(docker image inspect "$IMAGE" --format '{{.Size}}' | numfmt --to=iec)"
  # images of older commits go; dangling build-cache layers only when a day old, so rebuilds stay incremental
  docker images --format '{{.Repository}}:{{.Tag}}' kfloop | { grep -vxF "$IMAGE" || true; } | xargs -r docker rmi >/dev/null
  docker image prune --force --filter "until=24h" >/dev/null

  [ "$MODE" = all ] || return 0

  step chain "tests/e2e_chain.py"
  PYTHONPATH=$ROOT "$PYTHON" tests/e2e_chain.py --image "$IMAGE"
  took chain
  # the KFP test server's Docker engine (no cluster) and the Kubernetes test cluster's Docker kubelet on this image:
  # each task and each training pod a container, as its user, read-only root
  step docker-tests "tests/test_kfp_executor_docker.py tests/test_docker_kubelet.py"
  KFLOOP_E2E_IMAGE=$IMAGE "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_kfp_executor_docker.py \
    tests/test_docker_kubelet.py
  took docker-tests
}

main "$@"
