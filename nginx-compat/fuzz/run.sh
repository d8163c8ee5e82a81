#!/usr/bin/env bash
# Bounded fuzzing of the nginx parser, for CI and by hand:
#   nginx-compat/fuzz/run.sh [SECONDS]   (default 60)
# Installs cargo-fuzz from crates.io if missing; nightly features come from
# RUSTC_BOOTSTRAP=1 on the stable toolchain. The seed corpus is copied to a
# scratch directory so the run leaves the tree clean; a crash leaves its
# input under artifacts/parse/ and fails the script.
set -euo pipefail
seconds="${1:-60}"
cd "$(dirname "$0")"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp corpus/parse/seed-* "$corpus/"
RUSTC_BOOTSTRAP=1 cargo fuzz run parse "$corpus" -- \
    -dict=nginx.dict -max_len=8192 -max_total_time="$seconds" -rss_limit_mb=2048
