#!/usr/bin/env bash
# Builds the Salus container image (default localhost/salus:dev) from deploy/k8s/Containerfile with podman:
# salus-server and salus-device-plugin (target/release/), Python with TensorFlow 2.21 (tensorflow-cpu) and the
# salus-tf adapter (python/). Needs root. Takes minutes the first time (TensorFlow's wheels from PyPI); a second
# run reuses podman's layer cache and takes seconds. NOT run by CI (scripts/test.sh); see deploy/k8s/README.md.
#
#   scripts/build_image.sh            # build (or refresh) the image; prints its size
#   scripts/build_image.sh --gpu      # the GPU variant (default tag localhost/salus:dev-gpu): TensorFlow's GPU
#                                     # wheel, tensorflow[and-cuda]==2.21.0, whose pip dependencies (nvidia-*)
#                                     # are the CUDA runtime, cuDNN and cuBLAS; the driver (libcuda, nvidia-smi)
#                                     # comes from the node through the NVIDIA container toolkit. Needs binaries
#                                     # built with the cuda feature (SALUS_TF=gpu scripts/setup.sh).
#
# What it does, each step only when needed:
#   1. installs podman, runc, catatonit and mmdebstrap from apt (a policy-rc.d refusing service starts is put in place
#      during the install if there is none, and removed afterwards);
#   2. writes a containers.conf ($CONTAINERS_CONF, default /etc/containers/containers-salus.conf): runc (crun
#      fails on this machine's cgroups) and ulimits of 1024 (the defaults fail here); podman commands on this
#      machine need CONTAINERS_CONF pointing at it;
#   3. makes the base image (localhost/salus-base:bookworm) from Debian's mirror: mmdebstrap + podman import
#      (no container registry is needed or reachable);
#   4. builds the adapter's wheel and the image from a build context in a temporary directory.
# Environment: SALUS_IMAGE (the tag), SALUS_BASE_IMAGE, CONTAINERS_CONF, SALUS_SERVER_BIN,
# SALUS_DEVICE_PLUGIN_BIN (the binaries; default target/release/).
set -euo pipefail

gpu=""
for arg in "$@"; do
    case "$arg" in
        --gpu) gpu=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build_image: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${SALUS_IMAGE:-localhost/salus:dev${gpu:+-gpu}}"
BASE_IMAGE="${SALUS_BASE_IMAGE:-localhost/salus-base:bookworm}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-/etc/containers/containers-salus.conf}"
SERVER_BIN="${SALUS_SERVER_BIN:-$REPO/target/release/salus-server}"
PLUGIN_BIN="${SALUS_DEVICE_PLUGIN_BIN:-$REPO/target/release/salus-device-plugin}"
PYTHON="${SALUS_PYTHON:-$REPO/.venv/bin/python}"
start=$SECONDS

say() { echo "build_image: $*"; }
die() { echo "build_image: $*" >&2; exit 1; }

[[ "$(id -u)" == 0 ]] || die "run as root (rootful podman; apt-get install)"
for f in "$SERVER_BIN" "$(dirname "$SERVER_BIN")/salus-supervisor" "$(dirname "$SERVER_BIN")/salus" "$PLUGIN_BIN"; do
    [[ -x "$f" ]] || die "$f not found: build it first (cargo build --release --bins, or cargo build --release -p salus-device-plugin)"
done
[[ -x "$PYTHON" ]] || die "$PYTHON not found: scripts/setup.sh makes the venv (it builds the adapter's wheel)"
# A cuda build names the CUDA driver library it loads at run time (server/src/gpu.rs); a CPU build does not,
# and on a GPU node would share the host's CPU instead of the GPU's memory.
if [[ -n "$gpu" ]] && ! grep -q 'libcuda\.so\.1' "$SERVER_BIN"; then
    die "$SERVER_BIN is not a cuda build: build it with SALUS_TF=gpu scripts/setup.sh (or cargo build --release --features salus-server/cuda) for --gpu"
fi

# 1. Tools.
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
# podman builds its pod infra ("pause") image from catatonit (podman kube play, podman pod create).
[[ -x /usr/libexec/podman/catatonit ]] || command -v catatonit >/dev/null 2>&1 || missing+=(catatonit)
if [[ ${#missing[@]} -gt 0 ]]; then
    say "installing ${missing[*]} (apt)"
    own_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\n# Added by salus scripts/build_image.sh while installing podman.\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        own_policy=1
    fi
    status=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null; } || status=$?
    [[ -n "$own_policy" ]] && rm -f /usr/sbin/policy-rc.d
    [[ $status == 0 ]] || die "apt-get install ${missing[*]} failed ($status)"
fi

# 2. containers.conf.
conf=$'[containers]\n# The defaults (nofile 1048576) fail on this machine.\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n[engine]\n# crun fails on this machine\'s cgroups (v1).\nruntime = "runc"\n'
if [[ ! -f "$CONTAINERS_CONF" ]] || [[ "$(cat "$CONTAINERS_CONF")"$'\n' != "$conf" ]]; then
    mkdir -p "$(dirname "$CONTAINERS_CONF")"
    printf '%s' "$conf" >"$CONTAINERS_CONF"
    say "wrote $CONTAINERS_CONF"
fi

# 3. The base image.
if ! podman image exists "$BASE_IMAGE"; then
    say "making $BASE_IMAGE from Debian's mirror (mmdebstrap, about 1-2 minutes)"
    tmp="$(mktemp -d /var/tmp/salus-base.XXXXXX)"
    trap 'rm -rf "$tmp"' EXIT
    mmdebstrap --quiet --variant=apt --include=ca-certificates bookworm "$tmp/rootfs.tar"
    podman import --quiet --change 'CMD ["/bin/bash"]' "$tmp/rootfs.tar" "$BASE_IMAGE" >/dev/null
    rm -rf "$tmp"
    trap - EXIT
fi

# 4. The build context and the image.
ctx="$(mktemp -d /var/tmp/salus-image-ctx.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/wheels"
cp "$SERVER_BIN" "$ctx/bin/salus-server"
# salus-server execs into it under --isolation tenant (it links no TensorFlow).
cp "$(dirname "$SERVER_BIN")/salus-supervisor" "$ctx/bin/salus-supervisor"
cp "$(dirname "$SERVER_BIN")/salus" "$ctx/bin/salus"
cp "$PLUGIN_BIN" "$ctx/bin/salus-device-plugin"
if [[ -n "$gpu" ]]; then
    # The same pins with TensorFlow's GPU wheel (its nvidia-* dependencies resolved by pip from PyPI).
    sed 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' "$REPO/deploy/k8s/requirements.txt" >"$ctx/requirements.txt"
    grep -q '^tensorflow\[and-cuda\]==' "$ctx/requirements.txt" || die "requirements.txt names no tensorflow-cpu pin"
else
    cp "$REPO/deploy/k8s/requirements.txt" "$ctx/"
fi
say "building the salus-tf wheel (python/)"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$ctx/wheels" "$REPO/python" >/dev/null
ls "$ctx"/wheels/salus_tf-*.whl >/dev/null

# pip inside the build verifies PyPI with the host's CA bundle (this machine's TLS goes through a proxy whose
# CA only the host's bundle has).
ca="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
ca_args=()
if [[ -f "$ca" ]]; then
    ca_args=(--volume "$ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi
revision="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "building $IMAGE (podman build; the first build downloads TensorFlow${gpu:+ and the CUDA libraries, about 6 GB}, several minutes)"
podman build --network host --layers --build-arg "BASE=$BASE_IMAGE" "${ca_args[@]}" \
    --label "org.opencontainers.image.source=salus" --label "org.opencontainers.image.revision=$revision" \
    --label "io.salus.tensorflow=${gpu:+gpu}${gpu:-cpu}" \
    --file "$REPO/deploy/k8s/Containerfile" --tag "$IMAGE" "$ctx"
rm -rf "$ctx"
trap - EXIT

size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
say "$IMAGE built in $((SECONDS - start)) s: $((size / 1024 / 1024)) MiB ($size bytes)"
podman images --filter "reference=$IMAGE"
