"""Real Unix users for a benchmark's tenants mode (bench_load.py --users): created for one run, removed after it.

A loopback client's tenant is its Unix user (salus-server's default --auth both), so a benchmark that wants N
tenants runs its client processes as N users. This is integration_tests/conftest.py's `unix_users` fixture
without pytest:

- `bench_users(count)`: a context manager that creates salus-bench-u0 .. u{count-1} (useradd, home 0700, own
  group), makes the interpreter, the venv and the given paths reachable for them (o+x on ancestor directories
  that lack it: pyenv's Python lives under /root, mode 0700) and, in its finally, restores those modes and
  removes the users (`userdel -r`, retried while a process of theirs, e.g. a server's executor, is still
  exiting). Users of those names left over by a killed run are removed first. Needs root.
- `popen_as(user, argv, env)`: a subprocess as that user (its uid, primary group, no supplementary groups), in
  its home directory with HOME/USER/LOGNAME set, as a login would.
- `owned_dir(parent, user)`: a directory owned by the user (0700) for its processes' files; `parent` must be
  passable for others (0711).

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "salus-bench-u"


def _made_traversable(paths) -> list[tuple[str, int]]:
    """Adds o+x (search, not read) to every ancestor directory of `paths` that lacks it; returns what changed."""
    changed = []
    for path in paths:
        p = Path(path).resolve()
        for directory in [*reversed(p.parents), *([p] if p.is_dir() else [])]:
            mode = directory.stat().st_mode
            if not mode & 0o001:
                os.chmod(directory, mode | 0o001)
                changed.append((str(directory), mode & 0o7777))
    return changed


def _restore_modes(changed) -> None:
    for directory, mode in reversed(changed):
        os.chmod(directory, mode)


def _remove(name: str) -> bool:
    """userdel -r NAME, retried for a few seconds while a process of the user still runs. True when it is gone."""
    for _ in range(20):
        try:
            pwd.getpwnam(name)
        except KeyError:
            return True
        proc = subprocess.run(["userdel", "-r", name], capture_output=True, text=True)
        if proc.returncode in (0, 12):  # 12: the home directory could not be removed (the user is gone)
            return True
        time.sleep(0.5)
    sys.stderr.write(f"bench: could not remove user {name}: {proc.stderr.strip()}\n")
    return False


@contextlib.contextmanager
def bench_users(count: int, reach=()):
    """Yields `count` pwd entries of fresh users; see the module docstring."""
    if os.geteuid() != 0:
        sys.exit("bench: the tenants mode creates Unix users and needs root")
    if shutil.which("useradd") is None:
        sys.exit("bench: useradd is missing (Debian: apt-get install passwd)")
    names = [f"{PREFIX}{k}" for k in range(count)]
    for name in names:  # left over by a run that was killed
        _remove(name)
    def interrupted(*_):
        raise KeyboardInterrupt("SIGTERM")

    # A SIGTERM would end the driver without running the finally below: make it an exception instead.
    previous = signal.signal(signal.SIGTERM, interrupted)
    users, changed = [], []
    try:
        for name in names:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name],
                           check=True, capture_output=True)
            entry = pwd.getpwnam(name)
            os.chmod(entry.pw_dir, 0o700)
            users.append(entry)
        python = Path(sys.executable)
        changed = _made_traversable([python.resolve(), python.parent, *reach])
        yield users
    finally:
        _restore_modes(changed)
        for name in names:
            _remove(name)
        signal.signal(signal.SIGTERM, previous)


def popen_as(user, argv: list[str], env: dict, **kwargs) -> subprocess.Popen:
    full_env = {**env, "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}
    return subprocess.Popen(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=full_env,
                            cwd=kwargs.pop("cwd", user.pw_dir), **kwargs)


def owned_dir(parent: Path, user) -> Path:
    path = parent / user.pw_name
    path.mkdir(mode=0o700)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path
