#!/usr/bin/env bash
# Instructions per request per stage of the filter (callgrind), for each pool and kind of call
# of the driver `hot_path.rs`, whose binary must be built (see its header). Usage:
#   filter-core/examples/hot_path.sh [N] [BINARY]
set -euo pipefail
n=${1:-500}
bin=${2:-target/release/examples/hot_path}
out=$(mktemp -d)
printf '| pool | call | front.request | attempt.request | attempt.response | front.response | attempt.log | front.log | total |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n'
for pool in small large; do
  for kind in ${KINDS:-unary stream anthropic long messages}; do
    valgrind --tool=callgrind --callgrind-out-file="$out/$pool-$kind" "$bin" "$n" "$pool" "$kind" >"$out/$pool-$kind.txt" 2>/dev/null
    # The inclusive cost of each stage function; the setup (the pool's state) is outside them.
    callgrind_annotate --inclusive=yes --threshold=100 "$out/$pool-$kind" 2>/dev/null |
      awk -v n="$n" -v pool="$pool" -v kind="$kind" '
        /hot_path::stage_[a-z_]+ \[/ {
          ir = $1; gsub(",", "", ir)
          match($0, /hot_path::stage_[a-z_]+/); f = substr($0, RSTART + 16, RLENGTH - 16)
          if (!(f in cost)) cost[f] = ir
        }
        END {
          split("front_request attempt_request attempt_response front_response attempt_log front_log", order, " ")
          line = "| " pool " | " kind; total = 0
          for (i = 1; i <= 6; i++) { c = cost[order[i]] / n; total += c; line = line sprintf(" | %.0f", c) }
          print line sprintf(" | %.0f |", total)
        }'
  done
done
rm -rf "$out"
