"""The release wheel's launchers: `salus-server` and `salus-device-plugin` exec the binaries in salus/_bin/.

The server links TensorFlow 2.21's C API (libtensorflow_cc.so.2, libtensorflow_framework.so.2), which the
installed `tensorflow` package holds (tensorflow-cpu and tensorflow[and-cuda] install the same package
directory). scripts/build_release.sh gives the binary the rpath `$ORIGIN/../../tensorflow`: salus/_bin/ and
tensorflow/ side by side in one site-packages, the usual case. When TensorFlow is elsewhere (another
site-packages on sys.path: a user install beside a system one, a PYTHONPATH), the launcher finds it the way
`import tensorflow` would, without importing it (that takes seconds), and passes its directory in
LD_LIBRARY_PATH, which the server hands on to its executors. The binary is exec'd, not run as a child: signals,
the exit status and the process id (systemd, `salus-server-stop`) are the server's own.
"""

from __future__ import annotations

import importlib.util
import os
import sys

# The release the server's binary was built against: the C++ part of the server (allocator statistics) is
# compiled against this release's headers, so another TensorFlow 2.x, whose libraries share the soname, is
# refused here rather than failing in ways that are hard to read later.
TENSORFLOW_RELEASE = "2.21"
TF_LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")
# Binaries that link TensorFlow (the others, e.g. the device plugin, run without it).
NEEDS_TENSORFLOW = {"salus-server"}
INSTALL_HINT = ("install TensorFlow 2.21 into this Python environment: `pip install 'salus-tf[cpu]'` "
                "(tensorflow-cpu==2.21.0) or, on a GPU node, `pip install 'salus-tf[gpu]'` "
                "(tensorflow[and-cuda]==2.21.0)")


class LaunchError(Exception):
    """Why a binary cannot be started; the launcher prints it and exits with status 1."""


def bin_dir() -> str:
    """salus/_bin/ of this install (a release wheel's binaries)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def binary(name: str) -> str:
    path = os.path.join(bin_dir(), name)
    if not os.path.isfile(path):
        raise LaunchError(f"{path} is missing: this salus-tf was installed without the server's binaries "
                          "(from source, pip install ./python); install the release wheel "
                          "(scripts/build_release.sh writes it to dist/)")
    return path


def installed_tensorflow_release() -> str | None:
    """The version of the installed TensorFlow distribution (tensorflow or tensorflow-cpu), if pip knows it."""
    from importlib import metadata
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def tensorflow_dir() -> str:
    """The installed `tensorflow` package's directory, holding TF_LIBRARIES; found without importing it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        raise LaunchError(f"salus-server needs TensorFlow's libraries and this Python ({sys.executable}) has no "
                          f"`tensorflow` package: {INSTALL_HINT}")
    directory = os.path.dirname(spec.origin)
    missing = [lib for lib in TF_LIBRARIES if not os.path.isfile(os.path.join(directory, lib))]
    if missing:
        raise LaunchError(f"the `tensorflow` package at {directory} has no {', '.join(missing)}: {INSTALL_HINT}")
    release = installed_tensorflow_release()
    if release is not None and release.split(".")[:2] != TENSORFLOW_RELEASE.split("."):
        raise LaunchError(f"this salus-server is built for TensorFlow {TENSORFLOW_RELEASE} and the installed "
                          f"one is {release} (at {directory}): {INSTALL_HINT}")
    return directory


def environment(name: str) -> dict:
    """The environment to exec `name` with: LD_LIBRARY_PATH names TensorFlow when the rpath would not find it."""
    env = dict(os.environ)
    if name not in NEEDS_TENSORFLOW:
        return env
    found = tensorflow_dir()
    beside = os.path.join(bin_dir(), os.pardir, os.pardir, "tensorflow")  # what $ORIGIN/../../tensorflow means
    if not (os.path.isdir(beside) and os.path.samefile(beside, found)):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (found, env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def main(name: str) -> int:
    """Execs salus/_bin/`name` with this process's arguments; returns only on an error (status 1)."""
    try:
        path = binary(name)
        env = environment(name)
        os.execve(path, [name, *sys.argv[1:]], env)
    except LaunchError as e:
        print(f"{name}: {e}", file=sys.stderr)
    except OSError as e:
        print(f"{name}: cannot run {os.path.join(bin_dir(), name)}: {e}", file=sys.stderr)
    return 1
