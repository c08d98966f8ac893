#!/usr/bin/env bash
# Builds the proxy-wasm filter (crate ai-router-filter) for wasm32-wasip1 in release mode with
# the toolchain scripts/setup.sh chose (target/.wasm-toolchain: rustup, or debian for Debian's
# rustc-web fallback), and prints the path of the .wasm on stdout (logs go to stderr).
#
#   ./scripts/build-wasm.sh            -> /path/to/target/wasm32-wasip1/release/ai_router_filter.wasm
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[build-wasm] %s\n' "$*" >&2; }
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac

toolchain="$(cat "$TARGET_DIR/.wasm-toolchain" 2>/dev/null || true)"
if [ -z "$toolchain" ]; then
    if command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
        toolchain="rustup"
    else
        log "no wasm toolchain recorded: run scripts/setup.sh first"
        exit 1
    fi
fi

WASM="$TARGET_DIR/wasm32-wasip1/release/ai_router_filter.wasm"
case "$toolchain" in
    rustup)
        log "cargo build --release --target wasm32-wasip1 -p ai-router-filter"
        cargo build --release --target wasm32-wasip1 -p ai-router-filter >&2
        ;;
    debian)
        # DESIGN.md §4: Debian's rustc-web with a std built from rust-web-src, linked by wasm-ld.
        log "Debian toolchain: /usr/bin/cargo build --release --target wasm32-wasip1 -Zbuild-std=std,panic_abort -p ai-router-filter"
        PATH="/usr/bin:$PATH" RUSTC_BOOTSTRAP=1 \
            CARGO_TARGET_WASM32_WASIP1_LINKER=/usr/lib/llvm-16/bin/wasm-ld \
            CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="-L /usr/lib/wasm32-wasi" \
            /usr/bin/cargo build --release --target wasm32-wasip1 \
            -Zbuild-std=std,panic_abort -p ai-router-filter >&2
        ;;
    *)
        log "unknown toolchain '$toolchain' in $TARGET_DIR/.wasm-toolchain: run scripts/setup.sh"
        exit 1
        ;;
esac

if [ ! -s "$WASM" ]; then
    log "the build did not produce $WASM"
    exit 1
fi
# A valid module starts with "\0asm".
if [ "$(head -c 4 "$WASM" | od -An -tx1 | tr -d ' \n')" != "0061736d" ]; then
    log "$WASM is not a WebAssembly module"
    exit 1
fi
log "built $(du -h "$WASM" | cut -f1) $WASM"
printf '%s\n' "$WASM"
