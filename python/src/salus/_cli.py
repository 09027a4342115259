"""The `salus` console script and `python -m salus`: exec the `salus` binary (the Rust CLI).

The commands (run, jobs, top, policy, hints, limits, token, drain, ...) live in one binary that links no
TensorFlow. It is looked for, in this order:

1. the package's own ``salus/_bin/salus`` (where the release wheel puts it);
2. ``$SALUS_BIN_DIR/salus``;
3. the checkout's ``target/release/salus`` recorded when this package was built from a checkout
   (``salus/_build_info.py``, written by hatch_build.py);
4. ``salus`` on PATH (other than this script).
"""

from __future__ import annotations

import os
import sys

BINARY = "salus"


def _executable(path: str | None) -> str | None:
    return path if path and os.path.isfile(path) and os.access(path, os.X_OK) else None


def _this_script() -> str | None:
    try:
        return os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    except OSError:
        return None


def candidates() -> list[tuple[str, str | None]]:
    """(where, path) in the order they are tried; path None where that place names nothing."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = [("the package's _bin/salus", os.path.join(here, "_bin", BINARY))]
    bin_dir = os.environ.get("SALUS_BIN_DIR")
    found.append(("$SALUS_BIN_DIR/salus", os.path.join(bin_dir, BINARY) if bin_dir else None))
    try:
        from . import _build_info
        built = os.path.join(_build_info.CARGO_TARGET_RELEASE, BINARY)
    except (ImportError, AttributeError):
        built = None
    found.append(("the checkout's target/release/salus", built))
    me = _this_script()
    on_path = None
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(directory or ".", BINARY)
        if _executable(path) and os.path.realpath(path) != me:
            on_path = path
            break
    found.append(("salus on PATH", on_path))
    return found


def find_binary() -> str | None:
    for _, path in candidates():
        if _executable(path):
            return path
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    binary = find_binary()
    if binary is None:
        looked = "; ".join(f"{where} ({path or 'not set'})" for where, path in candidates())
        sys.stderr.write(f"salus: cannot find the salus binary. Looked for {looked}. Install the salus-tf release "
                         "wheel, build a checkout (cargo build --release), or set SALUS_BIN_DIR.\n")
        return 2
    env = dict(os.environ)
    # `salus timeline --png` draws with this interpreter's salus._timeline and matplotlib (`salus run` drops it).
    env["SALUS_LAUNCHER_PYTHON"] = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(binary, [BINARY, *args], env)
    except OSError as e:
        sys.stderr.write(f"salus: cannot run {binary}: {e.strerror or e}\n")
        return 126
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
