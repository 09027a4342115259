"""Hatchling hooks: the package's version from Cargo.toml, the admin API's client from admin.proto, and (for a
release) the server's binaries.

Version (`VersionFromCargo`, a metadata hook): the workspace version in the repository's Cargo.toml
(`[workspace.package] version`) is the one source of the release's version; the wheel's metadata and
`salus.__version__` (a `salus/_version.py` written into the wheel) take it from there, as `salus-server
--version` and the seam's Hello do through cargo. An sdist carries a copy of Cargo.toml at its root.

Admin client (`AdminProtoHook`): `salus.v1.admin_pb2` (messages) and `salus.v1.admin_pb2_grpc` (the Admin stub)
are made by grpcio-tools' protoc each time the wheel is built, from the same proto/salus/v1/admin.proto the server
is compiled from, so the Python client and the server cannot drift apart. They are not in the source tree: a
regular wheel gets them from a temporary directory; an editable install writes them into src/salus/v1/
(git-ignored). The generator is pinned in pyproject.toml's [build-system] requires: the gencode a protoc writes
refuses to load under an older protobuf runtime, and the package must load under every protobuf that a
supported TensorFlow brings (4.25 with TF 2.16, 7.x with TF 2.21).

Release binaries (same hook, only with SALUS_RELEASE_BIN_DIR set; scripts/build_release.sh prepares that
directory): its bin/ (salus-server, salus-supervisor, libsalus_tf.so, ...; their rpaths already made relative by
the script) goes into `salus/_bin/`, its scripts/ into the install's bin/, its data/ under the install's prefix
(share/man/man1/, share/salus/systemd/); the wheel becomes platform-specific (`py3-none-linux_<arch>`: the
binaries use no Python ABI; auditwheel then names the manylinux policy) and gets the `salus-server` /
`salus-device-plugin` launcher scripts (salus/_launch.py).
Without the variable (`pip install ./python`, scripts/setup.sh) the wheel stays pure Python and carries no
binaries and no launchers, so a dev venv has no `salus-server` that could shadow target/release's.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import stat
import tempfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

PROTO = "salus/v1/admin.proto"
GENERATED = ("salus/v1/__init__.py", "salus/v1/admin_pb2.py", "salus/v1/admin_pb2_grpc.py")
# Binaries a release wheel cannot do without: the server, and what it execs under --isolation tenant (it looks
# for it beside its own binary: node/src/process.rs).
REQUIRED_BINARIES = ("salus-server", "salus-supervisor", "salus")
# Console launchers written for a release wheel, for the binaries in salus/_bin/ that exist.
LAUNCHERS = ("salus-server", "salus-device-plugin")
RELEASE_BIN_DIR = "SALUS_RELEASE_BIN_DIR"


def _cargo_toml(root: str) -> str:
    # An sdist has a copy at its root; a checkout has the workspace's one level up.
    for path in (os.path.join(root, "Cargo.toml"), os.path.join(root, "..", "Cargo.toml")):
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise RuntimeError(f"cannot find the workspace's Cargo.toml (looked in {root} and {root}/..): build the "
                       "package from the salus repository or its sdist")


def workspace_version(root: str) -> str:
    """`[workspace.package] version` of the repository's Cargo.toml, as PEP 440 writes it."""
    path = _cargo_toml(root)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # Read with a pattern rather than tomllib: the build may run under Python 3.9/3.10 (no tomllib).
    section = re.search(r"^\[workspace\.package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    version = section and re.search(r'^version\s*=\s*"([^"]+)"', section.group(1), re.M)
    if not version:
        raise RuntimeError(f'{path} has no [workspace.package] version = "..."')
    # Cargo's semver pre-releases (0.3.0-rc.1) are PEP 440's 0.3.0rc1.
    cargo = version.group(1)
    pre = re.fullmatch(r"(\d+\.\d+\.\d+)-(alpha|beta|rc)\.?(\d+)", cargo)
    if pre:
        return f"{pre.group(1)}{ {'alpha': 'a', 'beta': 'b', 'rc': 'rc'}[pre.group(2)] }{pre.group(3)}"
    if not re.fullmatch(r"\d+\.\d+\.\d+", cargo):
        raise RuntimeError(f"{path}: version {cargo!r} is neither X.Y.Z nor X.Y.Z-(alpha|beta|rc).N")
    return cargo


class VersionFromCargo(MetadataHookInterface):
    PLUGIN_NAME = "custom"

    def update(self, metadata: dict) -> None:
        metadata["version"] = workspace_version(self.root)


class AdminProtoHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def _proto_root(self) -> str:
        # An sdist carries the proto under proto/; a checkout has it in the repository's proto crate.
        for root in (os.path.join(self.root, "proto"), os.path.join(self.root, "..", "proto", "proto")):
            if os.path.isfile(os.path.join(root, PROTO)):
                return os.path.abspath(root)
        raise RuntimeError(f"cannot find {PROTO} (looked in {self.root}/proto and {self.root}/../proto/proto): "
                           "build the package from the salus repository or its sdist")

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        from grpc_tools import protoc  # a build requirement (pyproject.toml)
        import grpc_tools

        editable = version == "editable"
        self._tmp = tempfile.mkdtemp(prefix="salus-wheel-gen-")
        out = os.path.join(self.root, "src") if editable else self._tmp
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        args = ["grpc_tools.protoc", f"-I{self._proto_root()}", f"-I{well_known}",
                f"--python_out={out}", f"--grpc_python_out={out}", PROTO]
        if protoc.main(args) != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {PROTO}: {' '.join(args)}")
        with open(os.path.join(out, "salus", "v1", "__init__.py"), "w") as f:
            f.write('"""Modules generated from proto/salus/v1/admin.proto when the package is built."""\n')
        version_file = os.path.join(out, "salus", "_version.py")
        with open(version_file, "w") as f:
            f.write('"""Written when the package is built (python/hatch_build.py), from the workspace\'s '
                    'Cargo.toml."""\n\n'
                    f"VERSION = {self.metadata.version!r}\n")
        if not editable:
            for path in (*GENERATED, "salus/_version.py"):
                build_data["force_include"][os.path.join(out, path)] = path
        bin_dir = os.environ.get(RELEASE_BIN_DIR, "")
        if bin_dir and not editable:
            self._add_release_binaries(os.path.abspath(bin_dir), build_data)
        self._record_build_info(out, build_data, editable, release=bool(bin_dir))

    def _add_release_binaries(self, release_dir: str, build_data: dict) -> None:
        # The directory's layout (scripts/build_release.sh): bin/ -> salus/_bin/; scripts/ -> the install's bin/
        # as they are (e.g. the systemd units' salus-server-stop); data/<path> -> the install's <path> (man pages
        # in share/man/man1/, the systemd units in share/salus/systemd/).
        bin_dir = os.path.join(release_dir, "bin")
        missing = [name for name in REQUIRED_BINARIES if not os.path.isfile(os.path.join(bin_dir, name))]
        if missing:
            raise RuntimeError(f"{RELEASE_BIN_DIR}={release_dir} lacks bin/{', bin/'.join(missing)}: "
                               "scripts/build_release.sh prepares that directory")
        for name in sorted(os.listdir(bin_dir)):
            build_data["force_include"][os.path.join(bin_dir, name)] = f"salus/_bin/{name}"
        scripts_dir = os.path.join(release_dir, "scripts")
        for name in sorted(os.listdir(scripts_dir)) if os.path.isdir(scripts_dir) else ():
            build_data["shared_scripts"][os.path.join(scripts_dir, name)] = name
        data_dir = os.path.join(release_dir, "data")
        for parent, _, files in os.walk(data_dir):
            for name in files:
                path = os.path.join(parent, name)
                build_data["shared_data"][path] = os.path.relpath(path, data_dir)
        launchers = os.path.join(self._tmp, "launchers")
        os.makedirs(launchers)
        for name in LAUNCHERS:
            if not os.path.isfile(os.path.join(bin_dir, name)):
                continue
            script = os.path.join(launchers, name)
            # The installer replaces the shebang with the install's own interpreter.
            with open(script, "w") as f:
                f.write("#!/usr/bin/env python3\n"
                        f'"""Runs {name} from the salus-tf wheel (salus/_bin/)."""\n'
                        "import sys\n"
                        "from salus._launch import main\n"
                        f"sys.exit(main({name!r}))\n")
            os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            build_data["shared_scripts"][script] = name
        build_data["pure_python"] = False
        machine = platform.machine().lower()
        # auditwheel repair (scripts/build_release.sh) replaces linux_<arch> with the manylinux policy met.
        build_data["tag"] = f"py3-none-linux_{machine}"

    def _record_build_info(self, out: str, build_data: dict, editable: bool, release: bool) -> None:
        """salus/_build_info.py: where a checkout's `salus` binary is (the console script's third place to
        look, salus/_cli.py). A release wheel carries salus/_bin/salus instead and records nothing."""
        checkout = os.path.abspath(os.path.join(self.root, ".."))
        if release or os.environ.get("SALUS_RELEASE_BUILD") or not os.path.isfile(os.path.join(checkout, "Cargo.toml")):
            return
        target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(checkout, "target")
        release_dir = os.path.join(os.path.abspath(target), "release")
        text = ('"""Written by hatch_build.py: the checkout this package was built from (salus/_cli.py)."""\n'
                f"CARGO_TARGET_RELEASE = {release_dir!r}\n")
        path = os.path.join(out, "salus", "_build_info.py")
        with open(path, "w") as f:
            f.write(text)
        if not editable:
            build_data["force_include"][path] = "salus/_build_info.py"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
