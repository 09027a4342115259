#!/usr/bin/env bash
# Runs every test: setup (idempotent), Rust unit + integration tests, then the
# pytest end-to-end suites against the real release binary.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The tests start their own servers and compare with local runs: settings meant
# for a user's own server or adapter (SALUS_SERVER, SALUS_POLICY, ...) must not leak in.
for var in $(compgen -e | grep '^SALUS_' || true); do
    case "$var" in SALUS_TEST_TARGET|SALUS_SERVER_BIN) ;; *) unset "$var" ;; esac
done

scripts/setup.sh
# Release profile: shares the dependency build with the server binary.
cargo test --release --locked --workspace 2>&1
# GPU code stays optional: it must build without CUDA installed.
cargo check --release --locked --features cuda -p salus-server 2>&1
export SALUS_SERVER_BIN="$root/target/release/salus-server"
exec .venv/bin/python -m pytest integration_tests -q -p no:cacheprovider "$@"
