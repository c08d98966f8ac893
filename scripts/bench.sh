#!/usr/bin/env bash
# The benchmark (docs/benchmarks.md): builds what it runs, installs its extra tools when they
# are missing (pinned versions, inside bench/, ignored by git), then runs ai-router-bench
# (bench/src): a fake upstream, then one after the other direct, plain Envoy, ai-router (in
# two passes, then with gateway.onePass), LiteLLM, Portkey and (from a binary you built, below)
# agentgateway, then the ai-router scale table. Writes results.json and results.md.
#
#   scripts/bench.sh                          the full run (about 15 minutes)
#   scripts/bench.sh --smoke                  a few seconds per system: direct, plain Envoy,
#                                             ai-router and its sync probes, ai-router with one
#                                             pass (the test suite runs this)
#   scripts/bench.sh --systems envoy,ai-router --scale targets --out DIR
#   AGENTGATEWAY_BIN=/path/to/agentgateway scripts/bench.sh --systems direct,envoy-internal,ai-router,agentgateway
#   scripts/bench.sh --systems envoy-internal,wasm-noop,wasm-floor,ai-router   the platform's floor
#   scripts/bench.sh --systems direct,envoy-internal,wasm-floor,one-pass-floor,one-pass-retry  a first attempt in one pass
#   scripts/bench.sh --systems ai-router,ai-router@no-retry --phases c1,c16 --scale none   what a piece of the bootstrap costs
#
# agentgateway is never built nor installed here: AGENTGATEWAY_BIN names a binary built by hand
# (docs/benchmarks.md says how); without it the system is skipped with a message. With it, a
# run without --systems includes agentgateway.
#
# Options: --smoke, --systems LIST, --out DIR, and any other ai-router-bench option
# (--scale full|targets|keys|none, --phases LIST, --duration S, --warmup S, --rate R,
# --headers static|constant|changing, --upstream-workers N, --floor-writes N, --streak N,
# --many-virtual-keys N, --many-provider-keys N, --scale-rounds N; see `ai-router-bench --help`).
#
# The full run uses release builds of the control plane and of the load generator. The smoke
# run uses ENVOY_BIN, AI_ROUTER_BIN, AI_ROUTER_WASM and AI_ROUTER_BENCH_BIN when they are set
# (the test does), else builds the debug binaries.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

LITELLM_VERSION="1.106.12"   # litellm[proxy]; 1.82.7, 1.82.8 and 1.107.0 were compromised releases
PORTKEY_VERSION="1.15.2"     # @portkey-ai/gateway
# Portkey's issue 1389: with @hono/node-server after 1.14.x its streamed answers fail on node
# ("TypeError: immutable", 500); npm would pick the newest, so the last one that works is pinned.
HONO_NODE_SERVER_VERSION="1.14.0"
LITELLM_VENV="$ROOT/bench/.venv-litellm"
PORTKEY_DIR="$ROOT/bench/.portkey"

log() { printf '[bench.sh] %s\n' "$*" >&2; }

SMOKE=0
SYSTEMS=""
OUT=""
PASS=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1 ;;
        --systems) SYSTEMS="${2:?--systems needs a list}"; shift ;;
        --systems=*) SYSTEMS="${1#--systems=}" ;;
        --out) OUT="${2:?--out needs a directory}"; shift ;;
        --out=*) OUT="${1#--out=}" ;;
        -h|--help) sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) PASS+=("$1") ;;
    esac
    shift
done
if [ -z "$SYSTEMS" ]; then
    if [ "$SMOKE" = 1 ]; then SYSTEMS="direct,envoy,ai-router,ai-router-one-pass"; else SYSTEMS="direct,envoy,envoy-internal,ai-router,ai-router-one-pass,litellm,portkey"; fi
    if [ "$SMOKE" = 0 ] && [ -n "${AGENTGATEWAY_BIN:-}" ]; then SYSTEMS="$SYSTEMS,agentgateway"; fi
fi
wants() { case ",$SYSTEMS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# agentgateway: only from a binary the user built (AGENTGATEWAY_BIN); else skipped, loudly.
if wants agentgateway && { [ -z "${AGENTGATEWAY_BIN:-}" ] || [ ! -x "$AGENTGATEWAY_BIN" ]; }; then
    log "skipping agentgateway: AGENTGATEWAY_BIN ${AGENTGATEWAY_BIN:+($AGENTGATEWAY_BIN) }is not an executable; build it by hand as docs/benchmarks.md says and set AGENTGATEWAY_BIN=/path/to/agentgateway"
    SYSTEMS="$(printf ',%s,' "$SYSTEMS" | sed 's/,agentgateway,/,/g; s/^,//; s/,$//')"
    if [ -z "$SYSTEMS" ]; then
        log "no system left to run"
        exit 2
    fi
fi

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi

# Envoy 1.40 (the project's venv, as the tests use it).
ENVOY_BIN="${ENVOY_BIN:-$ROOT/.venv/bin/envoy}"
if [ ! -x "$ENVOY_BIN" ]; then
    log "no Envoy at $ENVOY_BIN: running scripts/setup.sh"
    ./scripts/setup.sh >&2
    ENVOY_BIN="$ROOT/.venv/bin/envoy"
fi

if [ "$SMOKE" = 1 ]; then
    if [ -z "${AI_ROUTER_WASM:-}" ] || [ ! -f "$AI_ROUTER_WASM" ]; then
        AI_ROUTER_WASM="$(./scripts/build-wasm.sh)"
    fi
    if [ -z "${AI_ROUTER_BIN:-}" ] || [ ! -x "$AI_ROUTER_BIN" ]; then
        log "cargo build -p ai-router-control-plane --bin ai-router"
        cargo build -p ai-router-control-plane --bin ai-router >&2
        AI_ROUTER_BIN="$TARGET_DIR/debug/ai-router"
    fi
    if [ -z "${AI_ROUTER_BENCH_BIN:-}" ] || [ ! -x "$AI_ROUTER_BENCH_BIN" ]; then
        log "cargo build -p ai-router-e2e --bin ai-router-bench"
        cargo build -p ai-router-e2e --bin ai-router-bench >&2
        AI_ROUTER_BENCH_BIN="$TARGET_DIR/debug/ai-router-bench"
    fi
else
    # Figures come from optimised builds: the filter is always built in release, the control
    # plane and the load generator are built in release here.
    AI_ROUTER_WASM="$(./scripts/build-wasm.sh)"
    log "cargo build --release -p ai-router-control-plane --bin ai-router"
    cargo build --release -p ai-router-control-plane --bin ai-router >&2
    AI_ROUTER_BIN="$TARGET_DIR/release/ai-router"
    log "cargo build --release -p ai-router-e2e --bin ai-router-bench"
    cargo build --release -p ai-router-e2e --bin ai-router-bench >&2
    AI_ROUTER_BENCH_BIN="$TARGET_DIR/release/ai-router-bench"
fi

# The floor of a proxy-wasm filter in both passes (bench/wasm-floor; docs/benchmarks.md,
# "The platform's floor"): built only when a floor system is asked for.
if wants wasm-noop || wants wasm-floor || wants one-pass-floor || wants one-pass-retry; then
    log "cargo build --release --target wasm32-wasip1 -p ai-router-wasm-floor"
    cargo build --release --target wasm32-wasip1 -p ai-router-wasm-floor >&2
    export AI_ROUTER_WASM_FLOOR="$TARGET_DIR/wasm32-wasip1/release/ai_router_wasm_floor.wasm"
fi

PEER_ARGS=()
if wants litellm; then
    if ! "$LITELLM_VENV/bin/python" -c \
        "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$LITELLM_VERSION')" \
        >/dev/null 2>&1; then
        log "installing litellm[proxy]==$LITELLM_VERSION into $LITELLM_VENV"
        python3 -m venv "$LITELLM_VENV"
        "$LITELLM_VENV/bin/pip" install --quiet --disable-pip-version-check \
            "litellm[proxy]==$LITELLM_VERSION" >&2
    fi
    PEER_ARGS+=(--litellm "$LITELLM_VENV/bin/litellm")
fi
if wants portkey; then
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        log "installing node and npm (Debian)"
        apt-get install -y nodejs npm >&2
    fi
    PORTKEY_PACKAGE="$PORTKEY_DIR/node_modules/@portkey-ai/gateway"
    version_of() { node -e "try{console.log(require('$1/package.json').version)}catch(e){}" 2>/dev/null || true; }
    if [ "$(version_of "$PORTKEY_PACKAGE")" != "$PORTKEY_VERSION" ] \
        || [ "$(version_of "$PORTKEY_DIR/node_modules/@hono/node-server")" != "$HONO_NODE_SERVER_VERSION" ]; then
        log "installing @portkey-ai/gateway@$PORTKEY_VERSION (@hono/node-server@$HONO_NODE_SERVER_VERSION) into $PORTKEY_DIR"
        mkdir -p "$PORTKEY_DIR"
        cat >"$PORTKEY_DIR/package.json" <<EOF
{
  "private": true,
  "description": "Portkey's gateway for scripts/bench.sh",
  "dependencies": { "@portkey-ai/gateway": "$PORTKEY_VERSION" },
  "overrides": { "@hono/node-server": "$HONO_NODE_SERVER_VERSION" }
}
EOF
        (cd "$PORTKEY_DIR" && npm install --no-audit --no-fund --ignore-scripts --silent >&2)
    fi
    PEER_ARGS+=(--portkey "$PORTKEY_PACKAGE/build/start-server.js" --node "$(command -v node)")
fi

if wants agentgateway; then
    PEER_ARGS+=(--agentgateway "$AGENTGATEWAY_BIN")
fi

if [ -z "$OUT" ]; then
    stamp="$(date -u +%Y%m%dT%H%M%SZ)-$(git rev-parse --short HEAD 2>/dev/null || echo nogit)"
    if [ "$SMOKE" = 1 ]; then stamp="$stamp-smoke"; fi
    OUT="$TARGET_DIR/bench/$stamp"
fi
mkdir -p "$OUT"

export ENVOY_BIN AI_ROUTER_BIN AI_ROUTER_WASM
SMOKE_ARG=()
if [ "$SMOKE" = 1 ]; then SMOKE_ARG=(--smoke); fi
log "running $AI_ROUTER_BENCH_BIN (results in $OUT)"
set +e
"$AI_ROUTER_BENCH_BIN" "${SMOKE_ARG[@]}" --systems "$SYSTEMS" --out "$OUT" \
    "${PEER_ARGS[@]}" "${PASS[@]}"
rc=$?
set -e
log "results: $OUT/results.md, $OUT/results.json"
exit "$rc"
