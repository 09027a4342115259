#!/usr/bin/env bash
# One command for a GPU node: checks Salus's GPU claims there, one line per claim (PASS/FAIL/SKIP) and a
# summary line; exits 1 if a claim failed. Run scripts/setup.sh first (on a GPU node it installs the GPU
# TensorFlow wheel and builds the server with the cuda feature).
#
#   scripts/gpu_check.sh                    # every claim (under 10 minutes on a GPU node)
#   scripts/gpu_check.sh --dry-run          # list the claims, start nothing
#   scripts/gpu_check.sh --only driver,tf1-on-gpu --keep-logs /tmp/gpu-check-logs
#   scripts/gpu_check.sh --rehearse-on-cpu  # the claims that mean something on a CPU, against CPU:0
#
# The claims themselves are in scripts/gpu_check.py (this is a thin wrapper that picks the Python).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$root/.venv/bin/python"
if [[ ! -x "$python" ]]; then
    # Without setup's venv the check can still list its claims or say there is no GPU.
    python="$(command -v python3 || true)"
fi
if [[ -z "$python" ]]; then
    echo "gpu_check: no Python found (run scripts/setup.sh first)" >&2
    exit 1
fi
exec "$python" "$root/scripts/gpu_check.py" "$@"
