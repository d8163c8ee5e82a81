#!/usr/bin/env bash
# Runs every agent fuzz target, coverage-guided, for a bounded time:
#     agent/fuzz/run.sh [seconds-per-target]   (default 15)
exec "$(dirname "$0")/../../fuzzing/cargo-fuzz.sh" "$(dirname "$0")" "${1:-15}" armory_config scrub relay_policy
