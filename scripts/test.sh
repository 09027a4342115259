#!/usr/bin/env bash
# Runs every test: setup (idempotent), Rust unit + integration tests, then the
# pytest end-to-end suites against the real release binary.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

scripts/setup.sh
# Release profile: shares the dependency build with the server binary.
cargo test --release --locked --workspace 2>&1
export SALUS_SERVER_BIN="$root/target/release/salus-server"
exec .venv/bin/python -m pytest integration_tests -q -p no:cacheprovider "$@"
