#!/usr/bin/env bash
# Runs every HTTP/2 wire-format fuzz target, coverage-guided, for a bounded
# time:
#     http2/fuzz/run.sh [seconds-per-target]   (default 15)
exec "$(dirname "$0")/../../fuzzing/cargo-fuzz.sh" "$(dirname "$0")" "${1:-15}" \
    frames hpack huffman
