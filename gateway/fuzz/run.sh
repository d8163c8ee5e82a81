#!/usr/bin/env bash
# Runs every gateway fuzz target for a bounded time (default 15 s each, about a
# minute in all). Needs cargo-fuzz; uses the nightly toolchain when installed,
# else the stable one with RUSTC_BOOTSTRAP=1 (sanitizer flags are unstable).
#
#     gateway/fuzz/run.sh [seconds-per-target]
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-15}"
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi
for target in proxy_header token hello jwt; do
  echo "== fuzz $target (${secs}s)"
  "${fuzz[@]}" run -O "$target" -- -max_total_time="$secs" -max_len=4096
done
