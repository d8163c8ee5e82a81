#!/usr/bin/env bash
# Runs every kube-api fuzz target, coverage-guided, for a bounded time:
#     kube-api/fuzz/run.sh [seconds-per-target]   (default 15)
exec "$(dirname "$0")/../../fuzzing/cargo-fuzz.sh" "$(dirname "$0")" "${1:-15}" protobuf selectors discovery_etag json_escaped
