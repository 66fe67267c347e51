#!/usr/bin/env bash
# Build the Retrieval Gate image and run `retrieval-gate demo` in it (docs/container.md).
#
#   1. Docker daemon: the one DOCKER_HOST (or the default socket) reaches; else
#      the one an earlier run of this script started; else, as root, install
#      docker.io from Debian if dockerd is missing and start dockerd without
#      iptables rules or a bridge (it keeps running for the next run).
#   2. Base image: $BASE_IMAGE if set (`docker build` pulls it if it is not
#      local); else retrieval-gate-base:bookworm, made once with debootstrap
#      (Debian bookworm, python3, python3-venv, ca-certificates, and this
#      machine's CA bundle) for machines that reach Debian's package mirror but
#      no image registry.
#   3. The image: docker build --network host (pip reaches PyPI from the build).
#   4. Checks in it: it runs as uid 10001; `demo` (Envoy + gate + fixture
#      upstream, loopback only: --network none) succeeds; the default `serve`
#      command with a mounted config becomes healthy (HEALTHCHECK).
#
# Re-running reuses the daemon, the base image and the build cache. Exits 1 on
# the first failure, saying which step failed.
#
# Environment: IMAGE (default retrieval-gate:local), BASE_IMAGE, GATE_DOCKER_DIR
# (this script's daemon: socket, data, log; default /var/tmp/retrieval-gate-docker),
# DEBIAN_MIRROR (default http://deb.debian.org/debian), HOST_CA_BUNDLE (copied
# into the debootstrap base; default /etc/ssl/certs/ca-certificates.crt).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
IMAGE="${IMAGE:-retrieval-gate:local}"
DEFAULT_BASE="retrieval-gate-base:bookworm"
STATE="${GATE_DOCKER_DIR:-/var/tmp/retrieval-gate-docker}"
SOCKET="$STATE/docker.sock"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA_BUNDLE="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
# An imported root file system carries no image config: give it the usual PATH.
BASE_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

say() { printf '==> %s\n' "$*"; }
die() { printf 'build-and-demo: FAILED: %s\n' "$*" >&2; exit 1; }
declare -a TIMINGS=()
timed() {  # timed LABEL COMMAND...: run a step, record how long it took
    local label="$1" started=$SECONDS
    shift
    "$@"
    TIMINGS+=("$(printf '%-8s %4ss' "$label" $((SECONDS - started)))")
}

cleanup_paths=()
serve_container=""
cleanup() {
    if [ -n "$serve_container" ]; then
        docker rm -f "$serve_container" >/dev/null 2>&1 || true
    fi
    for path in "${cleanup_paths[@]}"; do rm -rf "$path"; done
}
trap cleanup EXIT

apt_install() {
    [ "$(id -u)" -eq 0 ] || die "installing $* needs root (apt-get)"
    say "installing $* from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null || die "apt-get install $* failed"
}

daemon_answers() { docker info >/dev/null 2>&1; }

ensure_daemon() {
    if command -v docker >/dev/null 2>&1 && daemon_answers; then
        say "Docker daemon: ${DOCKER_HOST:-the default socket} answers"
        return
    fi
    [ -z "${DOCKER_HOST:-}" ] || die "DOCKER_HOST=$DOCKER_HOST is set but no Docker daemon answers there"
    export DOCKER_HOST="unix://$SOCKET"
    if command -v docker >/dev/null 2>&1 && daemon_answers; then
        say "Docker daemon: reusing the one this script started ($DOCKER_HOST)"
        return
    fi
    [ "$(id -u)" -eq 0 ] || die "no Docker daemon answers; starting one needs root (or start Docker yourself and set DOCKER_HOST)"
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
        apt_install docker.io
    fi
    mkdir -p "$STATE"
    say "starting dockerd on $DOCKER_HOST (no iptables, no bridge; log $STATE/dockerd.log)"
    setsid dockerd --iptables=false --bridge=none -H "$DOCKER_HOST" \
        --data-root "$STATE/data" --exec-root "$STATE/exec" --pidfile "$STATE/dockerd.pid" \
        </dev/null >>"$STATE/dockerd.log" 2>&1 &
    local pid=$! waited
    for waited in $(seq 60); do
        if daemon_answers; then
            say "Docker daemon ready after ${waited}s (pid $pid; stop it with: kill $pid)"
            return
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$STATE/dockerd.log" >&2
            die "dockerd exited during start-up (last lines of $STATE/dockerd.log above)"
        fi
        sleep 1
    done
    tail -n 20 "$STATE/dockerd.log" >&2
    die "dockerd (pid $pid) did not answer within 60s"
}

build_debootstrap_base() {
    [ "$(id -u)" -eq 0 ] || die "building the base image with debootstrap needs root"
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    local rootfs
    mkdir -p "$STATE"
    rootfs="$(mktemp -d "$STATE/rootfs.XXXXXX")"
    cleanup_paths+=("$rootfs")
    say "debootstrap: Debian bookworm minbase + python3 into $rootfs (about a minute)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$rootfs" "$DEBIAN_MIRROR" >"$STATE/debootstrap.log" 2>&1 \
        || { tail -n 20 "$STATE/debootstrap.log" >&2; die "debootstrap failed (log $STATE/debootstrap.log)"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    # The base trusts what this machine trusts: behind a TLS-inspecting proxy,
    # whose CA is in this machine's bundle only, pip in the build reaches PyPI.
    if [ -f "$HOST_CA_BUNDLE" ]; then
        say "base trusts this machine's CA bundle ($HOST_CA_BUNDLE)"
        cp "$HOST_CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    fi
    tar --numeric-owner -C "$rootfs" -c . \
        | docker import --change "ENV PATH=$BASE_PATH" --change "ENV LANG=C.UTF-8" \
            --change 'CMD ["python3"]' --message "debootstrap bookworm minbase + python3" \
            - "$DEFAULT_BASE" >/dev/null \
        || die "docker import of the debootstrap root file system failed"
    rm -rf "$rootfs"
    say "base image $DEFAULT_BASE built"
}

ensure_base() {
    if [ -n "${BASE_IMAGE:-}" ]; then
        say "base image: $BASE_IMAGE (from BASE_IMAGE)"
        return
    fi
    BASE_IMAGE="$DEFAULT_BASE"
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base image: $BASE_IMAGE already present"
    else
        build_debootstrap_base
    fi
    docker run --rm --network none "$BASE_IMAGE" python3 -c \
        'import sys, ensurepip, venv; assert sys.version_info >= (3, 11), sys.version' \
        || die "base image $BASE_IMAGE lacks Python 3.11+ with venv and ensurepip"
}

build_image() {
    if ! docker buildx version >/dev/null 2>&1; then
        # The docker.io daemon has no buildx plugin: the classic builder does
        # everything this Dockerfile needs (multi-stage, ARG in FROM).
        export DOCKER_BUILDKIT=0
    fi
    say "building $IMAGE from $ROOT (base $BASE_IMAGE)"
    # --force-rm: a failed step leaves no stopped container behind for the next run.
    docker build --network host --force-rm --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --tag "$IMAGE" "$ROOT" || die "docker build failed (output above)"
}

check_user() {
    local uid
    uid="$(docker run --rm --network none --entrypoint id "$IMAGE" -u)" || die "cannot run $IMAGE"
    [ "$uid" = 10001 ] || die "the image runs as uid $uid, not the non-root 10001"
    say "the image runs as uid $uid (non-root)"
}

run_demo() {
    say "running: docker run --rm --network none $IMAGE demo"
    docker run --rm --network none "$IMAGE" demo || die "the demo failed in the container (output above)"
}

check_serve() {
    local config data status waited
    config="$(mktemp -d)"
    cleanup_paths+=("$config")
    # trusted-headers: the smallest valid configuration, for this smoke test only.
    printf 'identity = "trusted-headers"\n' >"$config/gate.toml"
    chmod 755 "$config" && chmod 644 "$config/gate.toml"
    # The default store (sqlite:///retrieval-gate.db in the working directory)
    # must exist: only `store migrate` creates it, as an operator would, in a
    # volume the image's user (10001) may write.
    data="$(mktemp -d)"
    cleanup_paths+=("$data")
    chmod 777 "$data"
    docker run --rm --network none -v "$data:/var/lib/retrieval-gate" "$IMAGE" \
        store migrate --store sqlite:///retrieval-gate.db || die "store migrate failed in $IMAGE"
    say "running the default command (serve) with $config mounted, until the HEALTHCHECK passes"
    serve_container="$(docker run -d --network none --health-interval 2s \
        -v "$config:/etc/retrieval-gate:ro" -v "$data:/var/lib/retrieval-gate" "$IMAGE")" \
        || die "cannot start $IMAGE"
    for waited in $(seq 60); do
        status="$(docker inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$serve_container")"
        case "$status" in
            "running healthy")
                say "serve: healthy after ${waited}s"
                docker rm -f "$serve_container" >/dev/null
                serve_container=""
                return ;;
            running*) sleep 1 ;;
            *)
                docker logs "$serve_container" >&2 || true
                die "serve stopped ($status; its log above)" ;;
        esac
    done
    docker logs "$serve_container" >&2 || true
    die "serve did not become healthy within 60s (its log above)"
}

started=$SECONDS
timed daemon ensure_daemon
timed base ensure_base
timed build build_image
check_user
timed demo run_demo
timed serve check_serve
size="$(docker image inspect --format '{{.Size}}' "$IMAGE")"
base_size="$(docker image inspect --format '{{.Size}}' "$BASE_IMAGE" 2>/dev/null || echo 0)"
say "SUCCESS in $((SECONDS - started))s: $IMAGE is $((size / 1000000)) MB (base $BASE_IMAGE: $((base_size / 1000000)) MB)"
printf '    %s\n' "${TIMINGS[@]}"
