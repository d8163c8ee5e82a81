#!/usr/bin/env bash
# Runs every sidecar fuzz target, coverage-guided, for a bounded time:
#     sidecar/fuzz/run.sh [seconds-per-target]   (default 15)
exec "$(dirname "$0")/../../fuzzing/cargo-fuzz.sh" "$(dirname "$0")" "${1:-15}" dynamic_kubeconfig object_text
