#!/usr/bin/env bash
# One-time (idempotent) setup: project venv with TensorFlow and the Python adapter
# (python/), the cargo link configuration that points tensorflow-sys at TensorFlow's
# C API inside that venv, and a release build of the server and the C-API shim. It changes nothing outside
# the checkout (but pip's and cargo's caches); what only the tests need from the system (Prometheus, Slurm,
# Ray) is scripts/setup_test_tools.sh's, which scripts/test.sh runs.
#
#   scripts/setup.sh            # venv + link config + release build
#   SALUS_SKIP_BUILD=1 scripts/setup.sh   # venv + link config only
#   SALUS_TF=gpu|cpu scripts/setup.sh     # this TensorFlow wheel (default: gpu where an NVIDIA driver is)
#   SALUS_TF=gpu SALUS_VENV=.venv-gpu SALUS_VENV_ONLY=1 scripts/setup.sh
#                               # only a venv (TensorFlow, test tools, adapter) at another path: scripts/test.sh's
#                               # GPU-wheel run beside the default CPU one
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/${SALUS_VENV:-.venv}"
python="${PYTHON:-python3}"

TF_VERSION=2.21.0
# Every TensorFlow process imports ml_dtypes: 0.7.0's extension takes ~0.6 s of CPU to import, 0.6.0's ~5 ms
# (measured here; TensorFlow 2.21 asks for >=0.5.1,<1). The test suite starts hundreds of TensorFlow processes.
ML_DTYPES_VERSION=0.6.0

# Which TensorFlow wheel (the server links the C API of the one in the venv): the GPU wheel
# (tensorflow[and-cuda], TensorFlow with its CUDA libraries from PyPI) where an NVIDIA driver is
# present, else tensorflow-cpu; SALUS_TF=gpu|cpu overrides. Both are the same release, and the GPU
# wheel also runs on a machine without a GPU (TensorFlow falls back to the CPU), which is how a
# CPU-only machine tests a GPU node's build: SALUS_TF=gpu scripts/test.sh.
if [[ -n "${SALUS_TF:-}" ]]; then
    tf_flavor="$SALUS_TF"
    tf_why="SALUS_TF=$SALUS_TF"
elif command -v nvidia-smi > /dev/null 2>&1 || [[ -e /proc/driver/nvidia ]]; then
    tf_flavor=gpu
    tf_why="an NVIDIA driver is present"
else
    tf_flavor=cpu
    tf_why="no NVIDIA driver (no nvidia-smi, no /proc/driver/nvidia)"
fi
# `scripts/setup.sh --flavor` only prints the choice (scripts/test.sh starts the other wheel's venv beside setup).
if [[ "${1:-}" == --flavor ]]; then
    case "$tf_flavor" in gpu|cpu) echo "$tf_flavor"; exit 0 ;; esac
fi
case "$tf_flavor" in
    gpu) tf_wheel="tensorflow[and-cuda]==$TF_VERSION"; other_stamp="$venv/.salus-setup-$TF_VERSION-v3" ;;
    cpu) tf_wheel="tensorflow-cpu==$TF_VERSION"; other_stamp="$venv/.salus-setup-$TF_VERSION-gpu-v1" ;;
    *) echo "setup: SALUS_TF must be gpu or cpu, not '$tf_flavor'" >&2; exit 2 ;;
esac
# The CPU venv keeps the stamp it always had (no reinstall for existing checkouts).
if [[ "$tf_flavor" == gpu ]]; then stamp="$venv/.salus-setup-$TF_VERSION-gpu-v1"; else stamp="$venv/.salus-setup-$TF_VERSION-v3"; fi

if [[ ! -f "$stamp" ]]; then
    echo "setup: creating $venv with $tf_wheel ($tf_why; the CPU wheel takes about a minute, the GPU one several)"
    [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
    if [[ -f "$other_stamp" ]]; then
        # Both wheels install the same `tensorflow` package: remove the other one whole first.
        echo "setup: replacing the venv's other TensorFlow wheel"
        "$venv/bin/pip" uninstall --quiet --disable-pip-version-check -y tensorflow tensorflow-cpu
        rm -f "$other_stamp"
    fi
    tf_started=$SECONDS
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "$tf_wheel" "ml_dtypes==$ML_DTYPES_VERSION" pytest numpy grpcio grpcio-tools
    # Without --no-deps tf-keras pulls the full GPU tensorflow wheel over the CPU one.
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "tf-keras==$TF_VERSION"
    echo "setup: $tf_wheel and the test tools installed in $((SECONDS - tf_started)) s ($(du -sh "$venv" | cut -f1) venv)"
    touch "$stamp"
else
    echo "setup: $venv is ready ($tf_wheel: $tf_why)"
fi
# For venvs made before these lines: the fast ml_dtypes (above) and pytest-xdist (scripts/test.sh runs the
# end-to-end files on two workers).
if [[ "$("$venv/bin/python" -c "import ml_dtypes; print(ml_dtypes.__version__)" 2> /dev/null)" != "$ML_DTYPES_VERSION" ]]; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "ml_dtypes==$ML_DTYPES_VERSION"
fi
if ! "$venv/bin/python" -c "import xdist" 2> /dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "pytest-xdist==3.8.0"
fi
# matplotlib lives outside the venv: `import tensorflow` imports Keras 3, which imports matplotlib.pyplot when it
# can (~0.55 s of CPU in every TensorFlow process). Only `salus timeline --png` draws with it (the user installs
# it, README says); its test finds it in .venv-plot, with the venv's numpy. Venvs made before: removed once.
if [[ ! -f "$venv/.salus-matplotlib-outside" ]]; then
    "$venv/bin/pip" uninstall --quiet --disable-pip-version-check -y matplotlib > /dev/null 2>&1 || true
    touch "$venv/.salus-matplotlib-outside"
fi
plot="$root/.venv-plot"
if [[ "${SALUS_VENV_ONLY:-}" != 1 && ! -f "$plot/.salus-plot-3.11.2" ]]; then
    rm -rf "$plot"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --target "$plot" --no-deps "matplotlib==3.11.2" \
        contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six
    touch "$plot/.salus-plot-3.11.2"
fi
# Which wheel the venv has (cpu or gpu), for scripts/gpu_check.py (scripts/test.sh asks `setup.sh --flavor`).
echo "$tf_flavor" > "$venv/.salus-tf-flavor"

# The Python adapter (python/, distribution salus-tf, import name salus, CLI `salus`): reinstalled
# only when its sources change, so re-runs are quick and need no network. Its admin client is
# generated from admin.proto when it is built, so the proto counts as a source, and its version is the workspace's
# (Cargo.toml's [workspace.package] version line).
pkg_hash="$({ (cd python && find . -type f \( -name '*.py' -o -name '*.pth' -o -name '*.toml' -o -name '*.md' \) \
    -not -path '*/__pycache__/*' -not -path './build/*' -not -path './dist/*' -not -path './src/salus/v1/*' \
    -not -path './src/salus/_version.py' | LC_ALL=C sort | xargs sha256sum); sha256sum proto/proto/salus/v1/admin.proto
    grep -m1 '^version = ' Cargo.toml; } | sha256sum | cut -c1-16)"
pkg_stamp="$venv/.salus-python-$pkg_hash"
# Building ./python writes into the source tree (the generated admin client): one build at a time, also across
# setups running at once (scripts/test.sh makes .venv-gpu beside the main setup).
adapter_lock="$root/.venv-adapter-build.lock"
if [[ ! -f "$pkg_stamp" ]] || ! "$venv/bin/python" -c 'import salus' >/dev/null 2>&1; then
    echo "setup: installing the Python adapter (pip install ./python)"
    flock "$adapter_lock" "$venv/bin/pip" install --quiet --disable-pip-version-check ./python
    rm -f "$venv"/.salus-python-*
    touch "$pkg_stamp"
fi
[[ "${SALUS_VENV_ONLY:-}" == 1 ]] && { echo "setup: done ($venv only)"; exit 0; }

# Optional: a second venv with an older stock TF client (tensorflow-cpu 2.16.2 and the adapter), for
# integration_tests/test_tf2_old_client.py (the server must serve TF 2.16+ clients). Made with
# SALUS_OLD_TF=1, or under CI (.ci/run sets no variable of its own: CI=1 or SALUS_CI=1 count too).
OLD_TF_VERSION=2.16.2
old_venv="$root/.venv-tf2.16"
if [[ "${SALUS_OLD_TF:-}" == 1 || -n "${CI:-}" || -n "${SALUS_CI:-}" ]]; then
    old_stamp="$old_venv/.salus-setup-$OLD_TF_VERSION-v1"
    if [[ ! -f "$old_stamp" ]]; then
        echo "setup: creating $old_venv with tensorflow-cpu==$OLD_TF_VERSION"
        [[ -x "$old_venv/bin/python" ]] || "$python" -m venv "$old_venv"
        "$old_venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
        # TF 2.16 is built against numpy 1.x.
        "$old_venv/bin/pip" install --quiet --disable-pip-version-check \
            "tensorflow-cpu==$OLD_TF_VERSION" "numpy<2"
        touch "$old_stamp"
    fi
    old_pkg_stamp="$old_venv/.salus-python-$pkg_hash"
    if [[ ! -f "$old_pkg_stamp" ]]; then
        flock "$adapter_lock" "$old_venv/bin/pip" install --quiet --disable-pip-version-check --no-deps ./python
        rm -f "$old_venv"/.salus-python-*
        touch "$old_pkg_stamp"
    fi
fi

# TensorFlow's C API ships inside the wheel, split over two libraries.
tf_dir="$("$venv/bin/python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("tensorflow").origin))')"
for lib in libtensorflow_cc.so.2 libtensorflow_framework.so.2; do
    [[ -f "$tf_dir/$lib" ]] || { echo "setup: $tf_dir/$lib is missing" >&2; exit 1; }
done

# tensorflow-sys's build script would download libtensorflow (impossible here);
# a cargo `links` override skips that script and links the wheel's libraries.
# The server's build.rs reads SALUS_TF_LIB_DIR to set the rpath.
host="$(rustc -vV | sed -n 's/^host: //p')"
mkdir -p .cargo
cat > .cargo/config.toml <<TOML
# Generated by scripts/setup.sh; do not edit or commit.
[target.$host.tensorflow]
rustc-link-search = ["native=$tf_dir"]
rustc-link-lib = ["dylib:+verbatim=libtensorflow_cc.so.2", "dylib:+verbatim=libtensorflow_framework.so.2"]

[env]
SALUS_TF_LIB_DIR = "$tf_dir"
TOML
echo "setup: linking TensorFlow from $tf_dir"

if [[ -z "${SALUS_SKIP_BUILD:-}" ]]; then
    # --lib: also tf_adapter's libsalus_tf.so (the C-API shim; no binary of its own). With the GPU wheel
    # the server also reads the device's memory from the CUDA driver (the `cuda` feature, loaded at run time).
    features=()
    [[ "$tf_flavor" == gpu ]] && features=(--features salus-server/cuda)
    cargo build --release --locked --bins --lib "${features[@]}"
fi
echo "setup: done"
