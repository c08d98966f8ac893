#!/usr/bin/env bash
# The control plane's (and optionally Envoy's) resident memory at a given size of key table:
# makes N virtual keys straight into an SQLite key store, starts `ai-router serve` on a pool of
# P provider keys, optionally one Envoy on it, waits a while (the key sync's rechecks run), and
# prints VmRSS / VmHWM of each process. No load; no secret is printed.
#
#   scripts/cp-memory.sh [--virtual-keys N] [--provider-keys P] [--seconds S] [--envoy]
#
# AI_ROUTER_BIN (default target/release/ai-router), ENVOY_BIN and AI_ROUTER_WASM as elsewhere;
# CP_WRAP prefixes the serve command (e.g. "heaptrack -o /tmp/cp" with a debug build);
# ENVOY_YAML_EDIT names a command run on the rendered bootstrap's path before Envoy starts (to
# try a setting); ENVOY_CONCURRENCY (default 2) is Envoy's --concurrency.
set -euo pipefail

vks=10000 pks=1000 secs=15 envoy=0
while [ $# -gt 0 ]; do
  case "$1" in
    --virtual-keys) vks=$2; shift 2 ;;
    --provider-keys) pks=$2; shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --envoy) envoy=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${AI_ROUTER_BIN:-$root/target/release/ai-router}
dir=$(mktemp -d /tmp/cp-memory.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

rand() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
keys() { local i out=""; for ((i = 0; i < $2; i++)); do out+="${out:+,}sk-mem-$1-$i-$(rand)"; done; echo "$out"; }

half=$(( (pks + 1) / 2 ))
export MEM_A_API_KEYS MEM_B_API_KEYS
MEM_A_API_KEYS=$(keys a "$half")
MEM_B_API_KEYS=$(keys b $((pks - half)))
export AI_ROUTER_SYNC_TOKEN="sync-$(rand)" AI_ROUTER_ADMIN_TOKEN="admin-$(rand)" RUST_LOG=warn
cat >"$dir/pool.yaml" <<EOF
gateway:
  host: 127.0.0.1
  port: 0
  adminToken: { env: AI_ROUTER_ADMIN_TOKEN }
  keyStore: { type: sqlite, path: $dir/keys.db }
controlPlane: { host: 127.0.0.1, httpPort: 0, grpcPort: 0 }
providers:
EOF
for p in a b; do
  cat >>"$dir/pool.yaml" <<EOF
  - id: mem-$p
    kind: openai-compatible
    baseUrl: http://127.0.0.1:9/v1
    keysFromEnv: MEM_${p^^}
    models:
      - { id: bench-model, contextWindow: 128000, cost: { input: 0.15, output: 0.6 } }
EOF
done

if [ "$vks" -gt 0 ]; then
  "$bin" keys create --label mem --models bench-model --rpm 100000000 \
    --tokens-per-day 100000000000 --cost-per-day 1000000 --cost-per-month 10000000 \
    --count "$vks" --config "$dir/pool.yaml" >/dev/null
fi

${CP_WRAP:-} "$bin" serve --config "$dir/pool.yaml" >"$dir/serve.out" 2>"$dir/serve.err" &
cp=$!
pids+=("$cp")
for _ in $(seq 200); do grep -q grpc "$dir/serve.out" 2>/dev/null && break; sleep 0.1; done
grpc=$(sed -n 's/.*"grpc":"\([^"]*\)".*/\1/p' "$dir/serve.out")
[ -n "$grpc" ] || { echo "the control plane did not start" >&2; cat "$dir/serve.err" >&2; exit 1; }

if [ "$envoy" = 1 ]; then
  "$bin" render-envoy --config "$dir/pool.yaml" --control-plane "$grpc" \
    --wasm "${AI_ROUTER_WASM:-$root/target/wasm32-wasip1/release/ai_router_filter.wasm}" \
    --listen 127.0.0.1:0 --admin 127.0.0.1:0 --out "$dir/envoy.yaml"
  [ -n "${ENVOY_YAML_EDIT:-}" ] && $ENVOY_YAML_EDIT "$dir/envoy.yaml"
  "${ENVOY_BIN:-$root/.venv/bin/envoy}" -c "$dir/envoy.yaml" --concurrency "${ENVOY_CONCURRENCY:-2}" \
    --log-level warn --disable-hot-restart >"$dir/envoy.log" 2>&1 &
  pids+=("$!")
fi

cpu() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
mem() { awk -v n="$2" '/^VmRSS|^VmHWM/ { printf "%s %s %.1f MB  ", n, $1, $2 / 1024 }' "/proc/$1/status"; }
cpu0=$(cpu "$cp")
for ((s = 0; s < secs; s += 5)); do
  sleep 5
  line="t=$((s + 5))s "
  line+=$(mem "$cp" cp)
  [ "$envoy" = 1 ] && line+=$(mem "${pids[1]}" envoy)
  echo "$line"
done
echo "control plane CPU over the ${secs} s: $(awk -v a="$cpu0" -v b="$(cpu "$cp")" 'BEGIN { printf "%.2f", b - a }') s"
