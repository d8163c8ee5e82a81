#!/usr/bin/env bash
# Ingress request rate: the gateway (`spinlink gateway --nginx-config`) against
# nginx, both running the same nginx configuration (one TLS server with
# http2, `location / { proxy_pass http://app; }`), in front of the same
# upstream (a second nginx answering `200 ok` from memory), in the same run,
# loopback only. h2load drives HTTP/1.1 (--h1) and HTTP/2; the sides alternate
# and each rate is the median of RUNS runs. Each front's CPU time (user +
# system, from /proc, its worker processes included) over all its runs gives
# its CPU per request, steadier than the rates on a machine the load shares.
# Prints a Markdown block for bench/RESULTS.md.
#
#   cargo build --release -p spinlink
#   bench/ingress.sh   # RUNS=5 REQUESTS=20000 CLIENTS=10 STREAMS=10 NGINX_WORKERS=nproc
#
# Bounded: every h2load run has a fixed request count and a 60 s timeout.
#
#   INSTRUCTIONS=1 bench/ingress.sh   # REQUESTS=2200 SMALL=CLIENTS*20
#
# counts instructions per request instead (both fronts under callgrind).
# PROTOCOLS="h1" (or "h2") measures one protocol only; with INSTRUCTIONS=1
# and DUMPS=<dir>, the last dump of each process is then that protocol's.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SPINLINK=${SPINLINK:-$ROOT/target/release/spinlink}
NGINX=${NGINX:-/usr/sbin/nginx}
RUNS=${RUNS:-5}
# Under callgrind (INSTRUCTIONS=1) each request costs ~50 times as much.
REQUESTS=${REQUESTS:-$([ -n "${INSTRUCTIONS:-}" ] && echo 2200 || echo 20000)}
CLIENTS=${CLIENTS:-10}
STREAMS=${STREAMS:-10}
# nginx workers: the gateway's runtime uses every core, so nginx gets as many.
NGINX_WORKERS=${NGINX_WORKERS:-$(nproc)}

for tool in "$SPINLINK" "$NGINX" h2load openssl; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done

DIR=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "port $1 never opened" >&2; exit 1
}

openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench.test \
    -addext subjectAltName=DNS:bench.test \
    -keyout "$DIR/server.key" -out "$DIR/server.crt" 2>/dev/null

APP=$(free_port); NGX=$(free_port); GW=$(free_port)

cat >"$DIR/app.conf" <<EOF
worker_processes 1; daemon off; master_process off;
pid $DIR/app.pid; error_log $DIR/app-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    server { listen 127.0.0.1:$APP; location / { return 200 "ok\n"; } }
}
EOF

front() {
    cat <<EOF
worker_processes $NGINX_WORKERS; daemon off;
pid $DIR/front-$1.pid; error_log $DIR/front-$1-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    # nginx's default (1000 requests, then GOAWAY) would fail h2load's
    # remaining requests on each connection; the gateway has no such cap.
    keepalive_requests 1000000;
    proxy_http_version 1.1;
    # Upstream keepalive in nginx needs the client's Connection header gone.
    proxy_set_header Connection "";
    proxy_set_header Host \$host;
    proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-Proto \$scheme;
    upstream app { server 127.0.0.1:$APP; keepalive 32; }
    server {
        listen 127.0.0.1:$1 ssl http2 default_server;
        server_name bench.test;
        ssl_certificate $DIR/server.crt;
        ssl_certificate_key $DIR/server.key;
        location / { proxy_pass http://app; }
    }
}
EOF
}
front "$NGX" >"$DIR/nginx.conf"
front "$GW" >"$DIR/gateway.conf"

# INSTRUCTIONS=1: both fronts run under callgrind (nginx keeps root for its
# workers so callgrind_control may reach them).
UNDER=()
NGINX_UNDER=()
if [ -n "${INSTRUCTIONS:-}" ]; then
    command -v callgrind_control >/dev/null || { echo "missing: valgrind" >&2; exit 1; }
    UNDER=(valgrind -q --tool=callgrind --trace-children=yes --dump-instr=no
        "--callgrind-out-file=$DIR/callgrind.%p")
    NGINX_UNDER=(-g "user root;")
fi
"$NGINX" -p "$DIR" -c "$DIR/app.conf" & PIDS+=($!)
"${UNDER[@]}" "$NGINX" -p "$DIR" -c "$DIR/nginx.conf" "${NGINX_UNDER[@]}" & PIDS+=($!)
SPINLINK_LOG=warn "${UNDER[@]}" "$SPINLINK" gateway --nginx-config "$DIR/gateway.conf" >/dev/null & PIDS+=($!)
wait_port "$APP"; wait_port "$NGX"; wait_port "$GW"

# One h2load run; prints requests per second.
rate() { # port h1|h2
    local flags=(-n "$REQUESTS" -c "$CLIENTS" -T 60 -N 60)
    if [ "$2" = h1 ]; then flags+=(--h1); else flags+=(-m "$STREAMS"); fi
    local out
    out=$(h2load "${flags[@]}" "https://127.0.0.1:$1/index.html" 2>&1)
    if ! grep -q "$REQUESTS succeeded" <<<"$out"; then
        echo "h2load against port $1 ($2) did not succeed fully:" >&2
        grep -E "requests:|status codes:" <<<"$out" >&2
    fi
    awk '/^finished in/ { gsub(",", "", $4); print $4 }' <<<"$out"
}
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
# CPU time (user + system, clock ticks) of a process and its children.
ticks() { # pid
    local t=0 p
    for p in "$1" $(pgrep -P "$1" || true); do
        t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat")))
    done
    echo "$t"
}
declare -A PID_OF=([nginx]="${PIDS[1]}" [gateway]="${PIDS[2]}") PORT_OF=([nginx]="$NGX" [gateway]="$GW")
# One run of `side`: its rate into R, its CPU ticks into T.
measure() { # side proto
    local before after
    before=$(ticks "${PID_OF[$1]}")
    R[$1-$2]+="$(rate "${PORT_OF[$1]}" "$2") "
    after=$(ticks "${PID_OF[$1]}")
    T[$1-$2]=$(( ${T[$1-$2]:-0} + after - before ))
}

# Instructions per request (user space, every thread and process of the
# front), counted by callgrind: the difference between a run of SMALL and a
# run of REQUESTS requests over the same connections count, so handshakes and
# connection set-up cancel out.
if [ -n "${INSTRUCTIONS:-}" ]; then
    # The newest dump's total of every process of a front.
    total() { # pid
        local t=0 p f
        for p in "$1" $(pgrep -P "$1" || true); do
            f=$(ls -1 "$DIR"/callgrind."$p".* 2>/dev/null | sort -t. -k3 -n | tail -1)
            [ -n "$f" ] || continue
            t=$((t + $(awk '/^totals:/ { print $2 }' "$f")))
        done
        echo "$t"
    }
    control() { # flag pid
        local p
        for p in "$2" $(pgrep -P "$2" || true); do callgrind_control "$1" "$p" >/dev/null 2>&1; done
    }
    counted() { # side proto requests: instructions over one run
        local pid=${PID_OF[$1]}
        control -z "$pid"
        REQUESTS=$3 rate "${PORT_OF[$1]}" "$2" >/dev/null
        control -d "$pid"
        total "$pid"
    }
    SMALL=${SMALL:-$((CLIENTS * 20))}
    rate "$NGX" h1 >/dev/null; rate "$GW" h1 >/dev/null
    echo "## Ingress instructions per request: gateway vs nginx"
    echo
    echo '```'
    echo "INSTRUCTIONS=1 bench/ingress.sh   # REQUESTS=$REQUESTS SMALL=$SMALL CLIENTS=$CLIENTS STREAMS=$STREAMS"
    echo '```'
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); $(valgrind --version), callgrind; nginx $NGINX_WORKERS workers"
    echo
    echo "| protocol | nginx instructions per request | gateway instructions per request | gateway / nginx |"
    echo "|---|---|---|---|"
    for proto in ${PROTOCOLS:-h1 h2}; do
        declare -A I=()
        for side in nginx gateway; do
            small=$(counted "$side" "$proto" "$SMALL")
            large=$(counted "$side" "$proto" "$REQUESTS")
            I[$side]=$(( (large - small) / (REQUESTS - SMALL) ))
        done
        label=$([ "$proto" = h1 ] && echo "HTTP/1.1" || echo "HTTP/2")
        echo "| $label | ${I[nginx]} | ${I[gateway]} | $(awk -v g="${I[gateway]}" -v n="${I[nginx]}" 'BEGIN { printf "%.2f", g / n }') |"
    done
    # DUMPS=<dir> keeps the dumps (the last of each process is its large
    # run of the last protocol) for callgrind_annotate.
    if [ -n "${DUMPS:-}" ]; then mkdir -p "$DUMPS" && cp "$DIR"/callgrind.* "$DUMPS"/; fi
    exit 0
fi

# Warm-up, then alternate sides.
rate "$NGX" h2 >/dev/null; rate "$GW" h2 >/dev/null
declare -A R T
for proto in ${PROTOCOLS:-h1 h2}; do
    for side in nginx gateway; do R[$side-$proto]=""; T[$side-$proto]=0; done
    for _ in $(seq "$RUNS"); do
        measure nginx "$proto"
        measure gateway "$proto"
    done
done
# µs of CPU per request over all runs of a side.
per_request() { # side proto
    awk -v t="${T[$1-$2]}" -v hz="$(getconf CLK_TCK)" -v n="$((REQUESTS * RUNS))" \
        'BEGIN { printf "%.1f", t / hz * 1e6 / n }'
}

echo "## Ingress request rate: gateway vs nginx (issue 7)"
echo
echo '```'
echo "bench/ingress.sh   # RUNS=$RUNS REQUESTS=$REQUESTS CLIENTS=$CLIENTS STREAMS=$STREAMS"
echo '```'
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "- machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB memory"
echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///'), $NGINX_WORKERS workers; gateway: release build, one worker thread per CPU; same nginx config (TLS, http2, proxy_pass to a keepalive upstream)"
echo "- h2load $(h2load --version | head -1 | awk '{print $2}'): $REQUESTS requests per run, $CLIENTS connections; HTTP/2 with $STREAMS concurrent streams per connection"
echo
echo "| protocol | nginx req/s (median) | gateway req/s (median) | gateway / nginx | CPU µs per request, nginx / gateway | gateway CPU / nginx CPU |"
echo "|---|---|---|---|---|---|"
for proto in ${PROTOCOLS:-h1 h2}; do
    n=$(tr ' ' '\n' <<<"${R[nginx-$proto]}" | grep . | median)
    g=$(tr ' ' '\n' <<<"${R[gateway-$proto]}" | grep . | median)
    ratio=$(awk -v g="$g" -v n="$n" 'BEGIN { printf "%.2f", g / n }')
    cn=$(per_request nginx "$proto"); cg=$(per_request gateway "$proto")
    cratio=$(awk -v g="$cg" -v n="$cn" 'BEGIN { printf "%.2f", g / n }')
    label=$([ "$proto" = h1 ] && echo "HTTP/1.1" || echo "HTTP/2")
    echo "| $label | $n | $g | $ratio | $cn / $cg | $cratio |"
done
echo
for proto in ${PROTOCOLS:-h1 h2}; do
    echo "- runs $proto: nginx ${R[nginx-$proto]}; gateway ${R[gateway-$proto]}"
done
