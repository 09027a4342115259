#!/usr/bin/env bash
# Sets everything up, starts salus-server on its defaults (127.0.0.1:5501) and
# trains short demos through it: a TF1 graph script and an unmodified Keras 3 (TF2) script. The server stops when the demo ends;
# set SALUS_KEEP_SERVING=1 to keep it running until Ctrl-C.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

scripts/setup.sh
listen="${SALUS_LISTEN:-127.0.0.1:5501}"
log="$(mktemp -t salus-server.XXXXXX.log)"
./target/release/salus-server --listen "$listen" >"$log.out" 2>"$log" &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    grep -q "listening on" "$log.out" 2>/dev/null && break
    kill -0 $server 2>/dev/null || { cat "$log" >&2; echo "run: salus-server failed to start" >&2; exit 1; }
    sleep 0.1
done
echo "run: $(cat "$log.out") (log: $log)"
TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python scripts/demo.py --target "grpc://$listen"
.venv/bin/python scripts/demo_tf2.py --server "$listen"
if [[ -n "${SALUS_KEEP_SERVING:-}" ]]; then
    echo "run: salus-server keeps serving on $listen; Ctrl-C stops it"
    wait $server
fi
