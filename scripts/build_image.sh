#!/usr/bin/env bash
# Builds the Salus container image, tagged with the release's version (localhost/salus:<version>, the version
# in Cargo.toml), from deploy/k8s/Containerfile with podman: the release wheel (dist/, scripts/build_release.sh:
# salus-server, its supervisor, salus-device-plugin, the salus-tf adapter) in a venv with TensorFlow 2.21
# (tensorflow-cpu). Needs root. Takes minutes the first time (TensorFlow's wheels from PyPI); a second run
# reuses podman's layer cache and takes seconds. NOT run by CI (scripts/test.sh); see deploy/k8s/README.md.
#
#   scripts/build_image.sh            # build (or refresh) the image; prints its size
#   scripts/build_image.sh --gpu      # the GPU variant (localhost/salus:<version>-gpu): TensorFlow's GPU
#                                     # wheel, tensorflow[and-cuda]==2.21.0, whose pip dependencies (nvidia-*)
#                                     # are the CUDA runtime, cuDNN and cuBLAS; the driver (libcuda, nvidia-smi)
#                                     # comes from the node through the NVIDIA container toolkit. The release
#                                     # wheel's server is a cuda build (build_release.sh), so both variants
#                                     # install the same wheel.
#
# What it does, each step only when needed:
#   1. installs podman, runc, catatonit and mmdebstrap from apt (a policy-rc.d refusing service starts is put in place
#      during the install if there is none, and removed afterwards);
#   2. writes a containers.conf ($CONTAINERS_CONF, default /etc/containers/containers-salus.conf): runc (crun
#      fails on this machine's cgroups) and ulimits of 1024 (the defaults fail here); podman commands on this
#      machine need CONTAINERS_CONF pointing at it;
#   3. makes the base image (localhost/salus-base:bookworm) from Debian's mirror: mmdebstrap + podman import
#      (no container registry is needed or reachable);
#   4. builds the image from a build context in a temporary directory, with the release wheel of this version
#      from dist/ (run scripts/build_release.sh first; SALUS_WHEEL names another).
# Environment: SALUS_IMAGE (the tag), SALUS_BASE_IMAGE, CONTAINERS_CONF, SALUS_WHEEL (the release wheel).
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
# The one version (Cargo.toml's [workspace.package]): the wheel's, the image's tag, salus-server --version's.
VERSION="$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$REPO/Cargo.toml")"
IMAGE="${SALUS_IMAGE:-localhost/salus:$VERSION${gpu:+-gpu}}"
BASE_IMAGE="${SALUS_BASE_IMAGE:-localhost/salus-base:bookworm}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-/etc/containers/containers-salus.conf}"
start=$SECONDS

say() { echo "build_image: $*"; }
die() { echo "build_image: $*" >&2; exit 1; }

[[ "$(id -u)" == 0 ]] || die "run as root (rootful podman; apt-get install)"
[[ -n "$VERSION" ]] || die "no [workspace.package] version in $REPO/Cargo.toml"
if [[ -n "${SALUS_WHEEL:-}" ]]; then
    WHEEL="$SALUS_WHEEL"
else
    shopt -s nullglob
    # The wheel's spelling of the version (PEP 440): a Cargo pre-release 0.3.0-rc.1 is 0.3.0rc1.
    py_version="$(sed -E 's/-alpha\.?([0-9]+)$/a\1/; s/-beta\.?([0-9]+)$/b\1/; s/-rc\.?([0-9]+)$/rc\1/' <<<"$VERSION")"
    wheels=("$REPO"/dist/salus_tf-"$py_version"-py3-none-manylinux_*.whl)
    shopt -u nullglob
    [[ ${#wheels[@]} == 1 ]] || die "expected one release wheel of $VERSION in $REPO/dist (found ${#wheels[@]}): run scripts/build_release.sh"
    WHEEL="${wheels[0]}"
fi
[[ -f "$WHEEL" ]] || die "$WHEEL not found: scripts/build_release.sh writes the release wheel to dist/"
# A cuda build names the CUDA driver library it loads at run time (node/src/gpu.rs); a CPU build does not,
# and on a GPU node would share the host's CPU instead of the GPU's memory.
if [[ -n "$gpu" ]] && ! unzip -p "$WHEEL" salus/_bin/salus-server | grep -c 'libcuda\.so\.1' >/dev/null; then
    die "$WHEEL's salus-server is not a cuda build: build the wheel with scripts/build_release.sh (it builds with --features salus-server/cuda)"
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
mkdir -p "$ctx/wheels"
cp "$WHEEL" "$ctx/wheels/"
if [[ -n "$gpu" ]]; then
    # The same pins with TensorFlow's GPU wheel (its nvidia-* dependencies resolved by pip from PyPI).
    sed 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' "$REPO/deploy/k8s/requirements.txt" >"$ctx/requirements.txt"
    grep -q '^tensorflow\[and-cuda\]==' "$ctx/requirements.txt" || die "requirements.txt names no tensorflow-cpu pin"
else
    cp "$REPO/deploy/k8s/requirements.txt" "$ctx/"
fi

# pip inside the build verifies PyPI with the host's CA bundle (this machine's TLS goes through a proxy whose
# CA only the host's bundle has).
ca="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
ca_args=()
if [[ -f "$ca" ]]; then
    ca_args=(--volume "$ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi
revision="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "building $IMAGE from $(basename "$WHEEL") (podman build; the first build downloads TensorFlow${gpu:+ and the CUDA libraries, about 6 GB}, several minutes)"
podman build --network host --layers --build-arg "BASE=$BASE_IMAGE" --build-arg "SALUS_VERSION=$VERSION" \
    "${ca_args[@]}" --label "org.opencontainers.image.source=salus" --label "org.opencontainers.image.revision=$revision" \
    --label "org.opencontainers.image.version=$VERSION" \
    --label "io.salus.tensorflow=${gpu:+gpu}${gpu:-cpu}" \
    --file "$REPO/deploy/k8s/Containerfile" --tag "$IMAGE" "$ctx"
rm -rf "$ctx"
trap - EXIT

size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
say "$IMAGE built in $((SECONDS - start)) s: $((size / 1024 / 1024)) MiB ($size bytes)"
podman images --filter "reference=$IMAGE"
