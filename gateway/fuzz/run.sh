#!/usr/bin/env bash
# Runs every gateway fuzz target, coverage-guided, for a bounded time:
#     gateway/fuzz/run.sh [seconds-per-target]   (default 15)
exec "$(dirname "$0")/../../fuzzing/cargo-fuzz.sh" "$(dirname "$0")" "${1:-15}" \
    proxy_header client_hello token hello jwt relay_server message_sizes h1_answer host
