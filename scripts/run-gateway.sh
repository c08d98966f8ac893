#!/usr/bin/env bash
# Runs the gateway locally in one command: installs what is missing (scripts/setup.sh), builds
# the wasm filter and the release control plane, then execs `ai-router up` on the example pool
# with the project's Envoy 1.40. `ai-router up` prints one JSON line on stdout,
#   {"adminUrl":"http://127.0.0.1:8081","apiKey":"sk-starci-...","baseUrl":"http://127.0.0.1:8080/v1"}
# and logs to stderr. With no provider key in the environment it serves the pool from the
# built-in mock provider. Stop it with Ctrl-C.
#
#   ./scripts/run-gateway.sh                       # examples/pool.yaml
#   AI_ROUTER_CONFIG=my-pool.yaml ./scripts/run-gateway.sh [extra ai-router up args]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[run-gateway] %s\n' "$*" >&2; }

./scripts/setup.sh
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi

WASM="$(./scripts/build-wasm.sh)"
log "cargo build --release -p ai-router-control-plane"
cargo build --release -p ai-router-control-plane >&2

export ENVOY_BIN="${ENVOY_BIN:-$ROOT/.venv/bin/envoy}"
CONFIG="${AI_ROUTER_CONFIG:-examples/pool.yaml}"
log "ai-router up --config $CONFIG --wasm $WASM (ENVOY_BIN=$ENVOY_BIN)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
exec "$TARGET_DIR/release/ai-router" up --config "$CONFIG" --wasm "$WASM" "$@"
