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
    # SALUS_TF=gpu|cpu picks setup's TensorFlow wheel (SALUS_TF=gpu: the GPU wheel, also on a CPU-only machine).
    case "$var" in SALUS_TEST_TARGET|SALUS_SERVER_BIN|SALUS_ISOLATION|SALUS_TF) ;; *) unset "$var" ;; esac
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
# Release profile: shares the dependency build with the server binary. Builds the binaries the
# end-to-end suites run too, the C-API shim's second real client among them
# (tf_adapter/rust_client, for integration_tests/test_c_api_shim.py).
# The same features as setup's build (the GPU wheel's adds `cuda`), so its dependencies are reused.
features=()
[[ "$(cat .venv/.salus-tf-flavor 2>/dev/null)" == gpu ]] && features=(--features salus-server/cuda)
cargo test --release --locked --workspace "${features[@]}" 2>&1
phase_done "cargo test (build included)"

# Checks that only need to build run beside pytest, niced so that its servers come first;
# integration_tests/test_background_builds.py, the suite's last test, waits for them and
# fails with their output if one failed.
background="$(mktemp -d "${TMPDIR:-/tmp}/salus-ci-background.XXXXXX")"
(
    renice -n 19 -p "$BASHPID" > /dev/null 2>&1 || true
    started=$SECONDS
    set +e
    (
        set -eo pipefail
        # GPU code stays optional: it must build without CUDA installed.
        cargo check --release --locked --features cuda -p salus-server
        # The fuzz targets (fuzz/, their own workspace) must keep building. Built plainly, without
        # cargo-fuzz or nightly flags (libFuzzer linked, nothing instrumented), into target/ so the
        # dependencies built above are reused; fuzz/README.md says how to run them.
        cargo build --release --locked --manifest-path fuzz/Cargo.toml --target-dir target
        # Each target runs its committed seeds once (they include inputs that crashed the server).
        for target in request_decode tensor_proto eager_decode; do
            target/release/"$target" -runs=0 "fuzz/seeds/$target" 2>&1 | tail -n 1
        done
    ) > "$background/log" 2>&1
    echo "$?" > "$background/rc.tmp"
    echo "$((SECONDS - started))" > "$background/seconds"
    mv "$background/rc.tmp" "$background/rc"
) < /dev/null &
export SALUS_CI_BACKGROUND="$background"
export SALUS_SERVER_BIN="$root/target/release/salus-server"
export SALUS_CI_PHASES="$phases"
exec .venv/bin/python -m pytest integration_tests -q -p no:cacheprovider "$@"
