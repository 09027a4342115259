#!/usr/bin/env bash
# Builds the release wheel and the container image if needed (scripts/build_release.sh, then
# scripts/build_image.sh: idempotent, seconds when its layers are cached, minutes the first time) and runs integration_tests/test_container.py against it. Needs root. NOT run by CI
# (scripts/test.sh), where that test skips because the image is not built. See deploy/k8s/README.md.
#
#   scripts/test_container.sh [pytest args]      # SALUS_SKIP_BUILD=1: use the image as it is
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-/etc/containers/containers-salus.conf}"
if [[ "${SALUS_SKIP_BUILD:-}" != 1 ]]; then
    # The image installs the release wheel (dist/), which build_release.sh makes from a release build.
    "$REPO/scripts/build_release.sh"
    "$REPO/scripts/build_image.sh"
fi
cd "$REPO"
exec "$REPO/.venv/bin/python" -m pytest integration_tests/test_container.py -v "$@"
