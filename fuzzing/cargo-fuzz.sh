#!/usr/bin/env bash
# Coverage-guided runs of a crate's cargo-fuzz targets, each for a bounded
# time. The same bodies run in the test suite under spinlink-fuzzing; this
# is for longer runs by hand.
#
#     fuzzing/cargo-fuzz.sh FUZZ_DIR SECONDS TARGET...
#
# Installs cargo-fuzz from crates.io if missing. Uses the nightly toolchain
# when installed, else the stable one with RUSTC_BOOTSTRAP=1 (sanitizer
# flags are unstable). A crash leaves its input under FUZZ_DIR/artifacts/
# and fails the script.
set -euo pipefail
dir="$1"; secs="$2"; shift 2
cd "$dir"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi
for target in "$@"; do
  echo "== fuzz $target (${secs}s)"
  "${fuzz[@]}" run -O "$target" -- -max_total_time="$secs" -max_len=4096
done
