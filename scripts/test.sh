#!/usr/bin/env bash
# Runs every test: setup (idempotent), Rust unit + integration tests, then the
# pytest end-to-end suites against the real release binary.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The tests start their own servers and compare with local runs: settings meant
# for a user's own server or adapter (SALUS_SERVER, SALUS_POLICY, ...) must not leak in.
for var in $(compgen -e | grep '^SALUS_' || true); do
    # SALUS_ISOLATION=none runs the whole suite against single-process servers (tests that need one mode say so).
    case "$var" in SALUS_TEST_TARGET|SALUS_SERVER_BIN|SALUS_ISOLATION) ;; *) unset "$var" ;; esac
done

# The TF2 suites also run a TensorFlow 2.16 client (setup makes .venv-tf2.16 for it).
export SALUS_OLD_TF=1
# And the cluster engines (Slurm, Ray) for their suites.
export SALUS_CLUSTER=1

# Each phase's time, printed by pytest's summary (integration_tests/conftest.py) just above its last line.
phase_started=$SECONDS
phases=""
phase_done() {
    phases+="${phases:+; }$1 $((SECONDS - phase_started)) s"
    phase_started=$SECONDS
}

scripts/setup.sh
phase_done setup
# Release profile: shares the dependency build with the server binary.
cargo test --release --locked --workspace 2>&1
phase_done "cargo test (build included)"
# GPU code stays optional: it must build without CUDA installed.
cargo check --release --locked --features cuda -p salus-server 2>&1
phase_done "cuda check"
# The fuzz targets (fuzz/, their own workspace) must keep building. Built plainly, without
# cargo-fuzz or nightly flags (libFuzzer linked, nothing instrumented), into target/ so the
# dependencies built above are reused; fuzz/README.md says how to run them.
cargo build --release --locked --manifest-path fuzz/Cargo.toml --target-dir target 2>&1
# Each target runs its committed seeds once (they include inputs that crashed the server).
for target in request_decode tensor_proto eager_decode; do
    target/release/"$target" -runs=0 "fuzz/seeds/$target" 2>&1 | tail -n 1
done
phase_done "fuzz build and seeds"
# The C-API shim's second real client (integration_tests/test_c_api_shim.py); not a default member.
cargo build --release --locked -p salus-tf-rust-client 2>&1
phase_done "rust client build"
export SALUS_SERVER_BIN="$root/target/release/salus-server"
export SALUS_CI_PHASES="$phases"
exec .venv/bin/python -m pytest integration_tests -q -p no:cacheprovider "$@"
