#!/usr/bin/env bash
# Idempotent setup of the Ray venv (.venv-ray at the repository root, git-ignored by /.venv-*):
# ray 2.60.0 and the salus package (for salus.ray, the driver-side placement helper, and its admin
# client, which the small token task runs on the chosen node). Used by deploy/ray/salus-ray-start
# and integration_tests/test_ray.py; scripts/setup.sh calls it under CI.
#
#   scripts/setup_ray.sh                      # create or update .venv-ray
#   SALUS_RAY_VENV=/opt/salus-ray scripts/setup_ray.sh   # elsewhere (a cluster node's install)
#
# Re-runs are quick and need no network: ray is installed once (stamp), and the salus package again
# only when its sources or admin.proto change (hash stamp, as scripts/setup.sh does for .venv).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${SALUS_RAY_VENV:-$root/.venv-ray}"
python="${PYTHON:-python3}"

RAY_VERSION=2.60.0
stamp="$venv/.salus-ray-$RAY_VERSION-v1"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)

if [[ ! -f "$stamp" ]]; then
    echo "setup_ray: creating $venv with ray==$RAY_VERSION (a minute or two)"
    [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
    "${pip[@]}" --upgrade pip
    # Plain `ray` is what `ray start` needs (raylet, GCS, the worker runtime); no dashboard extras.
    # grpcio and protobuf run the salus admin client (salus.admin) in the token task.
    "${pip[@]}" "ray==$RAY_VERSION" "grpcio>=1.48" "protobuf>=4.25"
    touch "$stamp"
else
    echo "setup_ray: $venv is ready"
fi

# The salus package (import name salus): salus.ray must be importable by the driver and by Ray's
# workers (tasks of salus.ray are pickled by reference). --no-deps: no TensorFlow in this venv.
pkg_hash="$({ (cd python && find . -type f \( -name '*.py' -o -name '*.pth' -o -name '*.toml' -o -name '*.md' \) \
    -not -path '*/__pycache__/*' -not -path './build/*' -not -path './dist/*' -not -path './src/salus/v1/*' \
    | LC_ALL=C sort | xargs sha256sum); sha256sum proto/proto/salus/v1/admin.proto; } | sha256sum | cut -c1-16)"
pkg_stamp="$venv/.salus-python-$pkg_hash"
if [[ ! -f "$pkg_stamp" ]] || ! "$venv/bin/python" -c 'import salus.ray, salus.admin' >/dev/null 2>&1; then
    echo "setup_ray: installing the salus package into $venv (pip install --no-deps ./python)"
    "${pip[@]}" --no-deps ./python
    rm -f "$venv"/.salus-python-*
    touch "$pkg_stamp"
fi
