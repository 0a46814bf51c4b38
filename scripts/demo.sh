#!/bin/sh
# Starts one simulated prefill worker, one simulated decode worker and the router on 127.0.0.1;
# stops all three on Ctrl-C or as soon as any of them exits.
set -u
BUILD_DIR=${1:-build}
HOST=127.0.0.1
ROUTER_PORT=${BATON_DEMO_PORT:-8000}
PREFILL_PORT=${BATON_DEMO_PREFILL_PORT:-30001}
DECODE_PORT=${BATON_DEMO_DECODE_PORT:-30002}
BOOTSTRAP_PORT=${BATON_DEMO_BOOTSTRAP_PORT:-8998}

for bin in baton baton-worker; do
    if [ ! -x "$BUILD_DIR/$bin" ]; then
        echo "demo: $BUILD_DIR/$bin is missing; run 'make build' first" >&2
        exit 1
    fi
done

# A port something already listens on fails the demo here, before anything starts: a router
# already on the router port would answer /readiness for ours. (curl exits 7 on a refused
# connection; anything else means a listener.)
for port in "$ROUTER_PORT" "$PREFILL_PORT" "$DECODE_PORT" "$BOOTSTRAP_PORT"; do
    curl -s -o /dev/null --max-time 2 "http://$HOST:$port/" 2>/dev/null
    if [ $? -ne 7 ]; then
        echo "demo: port $port is in use on $HOST (set BATON_DEMO_PORT, BATON_DEMO_PREFILL_PORT," >&2
        echo "      BATON_DEMO_DECODE_PORT or BATON_DEMO_BOOTSTRAP_PORT to move the demo)" >&2
        exit 1
    fi
done

pids=""
cleanup() {
    trap - INT TERM EXIT
    for p in $pids; do kill "$p" 2>/dev/null; done
    for p in $pids; do wait "$p" 2>/dev/null; done
    echo "demo: stopped"
}
trap 'cleanup; exit 0' INT TERM
trap cleanup EXIT

"$BUILD_DIR/baton-worker" --mode prefill --host $HOST --port "$PREFILL_PORT" \
    --bootstrap-port "$BOOTSTRAP_PORT" &
pids="$pids $!"
"$BUILD_DIR/baton-worker" --mode decode --host $HOST --port "$DECODE_PORT" &
pids="$pids $!"
"$BUILD_DIR/baton" --host $HOST --port "$ROUTER_PORT" \
    --prefill "http://$HOST:$PREFILL_PORT" "$BOOTSTRAP_PORT" \
    --decode "http://$HOST:$DECODE_PORT" &
pids="$pids $!"

# Wait until the router reports a ready prefill/decode pair. A process that exited (a port in
# use, say) ends the demo: another router on the same port must not be taken for ours.
i=0
until curl -sf "http://$HOST:$ROUTER_PORT/readiness" >/dev/null 2>&1; do
    for p in $pids; do
        if ! kill -0 "$p" 2>/dev/null; then
            echo "demo: process $p exited before the router was ready (see its error above)" >&2
            exit 1
        fi
    done
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "demo: router did not become ready on $HOST:$ROUTER_PORT" >&2
        exit 1
    fi
    sleep 0.1
done
for p in $pids; do
    if ! kill -0 "$p" 2>/dev/null; then
        echo "demo: process $p exited before the router was ready (see its error above)" >&2
        exit 1
    fi
done

cat <<MSG

Baton is ready on http://$HOST:$ROUTER_PORT (prefill :$PREFILL_PORT, decode :$DECODE_PORT). Try:

  curl -s http://$HOST:$ROUTER_PORT/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"baton-sim","messages":[{"role":"user","content":"Hello there"}],"max_tokens":16}'

Streaming: add "stream":true. Metrics: curl -s http://$HOST:$ROUTER_PORT/metrics
Press Ctrl-C to stop.

MSG

# Stop everything as soon as any of the three exits.
while :; do
    for p in $pids; do
        if ! kill -0 "$p" 2>/dev/null; then
            echo "demo: process $p exited; stopping the others" >&2
            exit 1
        fi
    done
    sleep 0.5
done
