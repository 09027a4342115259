"""Hatchling build hook: generates the admin API's client modules from admin.proto.

`salus.v1.admin_pb2` (messages) and `salus.v1.admin_pb2_grpc` (the Admin stub) are made by grpcio-tools'
protoc each time the wheel is built, from the same proto/salus/v1/admin.proto the server is compiled
from, so the Python client and the server cannot drift apart. They are not in the source tree: a
regular wheel gets them from a temporary directory; an editable install writes them into
src/salus/v1/ (git-ignored).

The generator is pinned in pyproject.toml's [build-system] requires: the gencode a protoc writes
refuses to load under an older protobuf runtime, and the package must load under every protobuf that
a supported TensorFlow brings (4.25 with TF 2.16, 7.x with TF 2.21).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = "salus/v1/admin.proto"
GENERATED = ("salus/v1/__init__.py", "salus/v1/admin_pb2.py", "salus/v1/admin_pb2_grpc.py")


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
        self._tmp = None if editable else tempfile.mkdtemp(prefix="salus-admin-gen-")
        out = os.path.join(self.root, "src") if editable else self._tmp
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        args = ["grpc_tools.protoc", f"-I{self._proto_root()}", f"-I{well_known}",
                f"--python_out={out}", f"--grpc_python_out={out}", PROTO]
        if protoc.main(args) != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {PROTO}: {' '.join(args)}")
        with open(os.path.join(out, "salus", "v1", "__init__.py"), "w") as f:
            f.write('"""Modules generated from proto/salus/v1/admin.proto when the package is built."""\n')
        if not editable:
            for path in GENERATED:
                build_data["force_include"][os.path.join(out, path)] = path
        self._record_build_info(out, build_data, editable)

    def _record_build_info(self, out: str, build_data: dict, editable: bool) -> None:
        """salus/_build_info.py: where a checkout's `salus` binary is (the console script's third place to
        look, salus/_launch.py). A release wheel carries salus/_bin/salus instead and records nothing."""
        checkout = os.path.abspath(os.path.join(self.root, ".."))
        if os.environ.get("SALUS_RELEASE_BUILD") or not os.path.isfile(os.path.join(checkout, "Cargo.toml")):
            return
        target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(checkout, "target")
        release = os.path.join(os.path.abspath(target), "release")
        text = ('"""Written by hatch_build.py: the checkout this package was built from (salus/_launch.py)."""\n'
                f"CARGO_TARGET_RELEASE = {release!r}\n")
        path = os.path.join(out, "salus", "_build_info.py")
        with open(path, "w") as f:
            f.write(text)
        if not editable:
            build_data["force_include"][path] = "salus/_build_info.py"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
