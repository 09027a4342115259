"""Settings: server address and job hints, from the environment and salus.configure().

Pure standard library and cheap: imported by the startup hook when SALUS_SERVER is set.

Hints reach the server in ConfigProto.experimental.session_metadata.name, in the format the server parses:

    NAME[?key=value[&key=value...]]      keys: priority (int), iterations (int > 0), seconds (float > 0)
"""

from __future__ import annotations

import math
import os
import sys

DEFAULT_SERVER = "127.0.0.1:5501"

ENV_SERVER = "SALUS_SERVER"
ENV_NAME = "SALUS_JOB_NAME"
ENV_PRIORITY = "SALUS_PRIORITY"
ENV_ITERATIONS = "SALUS_EXPECTED_ITERATIONS"
ENV_SECONDS = "SALUS_EXPECTED_SECONDS"
HINT_ENV = (ENV_NAME, ENV_PRIORITY, ENV_ITERATIONS, ENV_SECONDS)
# SALUS_EAGER=0 keeps TF2 eager work (eager ops, tf.function, Keras 3) in the script's process.
ENV_EAGER = "SALUS_EAGER"
_FALSE = ("0", "false", "no", "off")

# priority is an int32 on the server.
_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1
_UINT64_MAX = 2 ** 64 - 1


class SalusConfigError(ValueError):
    """A server address or job hint that the server would refuse (or could not be reached with)."""


def normalize_server(value: str, source: str = "server") -> str:
    """'host:port' from 'host:port' or 'grpc://host:port' (IPv6 as '[::1]:5501')."""
    text = str(value).strip()
    if text.startswith("grpc://"):
        text = text[len("grpc://"):]
    elif "://" in text:
        raise SalusConfigError(f"{source}={value!r} is not valid: expected HOST:PORT or grpc://HOST:PORT")
    text = text.rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
        raise SalusConfigError(f"{source}={value!r} is not valid: expected HOST:PORT or grpc://HOST:PORT, "
                               f"e.g. {DEFAULT_SERVER}")
    return text


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def check_name(value: str, source: str = "name") -> str:
    name = str(value)
    if "?" in name:
        raise SalusConfigError(f"{source}={value!r} is not valid: a job name cannot contain '?'")
    if any(ord(c) < 32 for c in name):
        raise SalusConfigError(f"{source}={value!r} is not valid: a job name cannot contain control characters")
    return name


def check_priority(value, source: str = "priority") -> int:
    try:
        if isinstance(value, bool) or isinstance(value, float):
            raise ValueError
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise SalusConfigError(f"{source}={value!r} is not valid: expected an integer") from None
    if not _INT32_MIN <= n <= _INT32_MAX:
        raise SalusConfigError(f"{source}={value!r} is not valid: expected an integer in "
                               f"[{_INT32_MIN}, {_INT32_MAX}]")
    return n


def check_iterations(value, source: str = "iterations") -> int:
    try:
        if isinstance(value, bool) or isinstance(value, float):
            raise ValueError
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise SalusConfigError(f"{source}={value!r} is not valid: expected a positive integer") from None
    if not 0 < n <= _UINT64_MAX:
        raise SalusConfigError(f"{source}={value!r} is not valid: expected a positive integer")
    return n


def check_seconds(value, source: str = "seconds") -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        s = float(str(value).strip()) if not isinstance(value, (int, float)) else float(value)
    except ValueError:
        raise SalusConfigError(f"{source}={value!r} is not valid: expected a positive number of seconds") \
            from None
    if not (math.isfinite(s) and s > 0):
        raise SalusConfigError(f"{source}={value!r} is not valid: expected a positive number of seconds")
    return s


def default_job_name() -> str:
    """The script's file name (python train.py -> 'train.py'); 'python' for -c / interactive use."""
    argv0 = (getattr(sys, "argv", None) or [""])[0]
    if argv0 in ("", "-", "-c"):
        return "python"
    name = os.path.basename(argv0.rstrip(os.sep)) or "python"
    if name == "__main__.py":  # python -m package
        name = os.path.basename(os.path.dirname(argv0)) or name
    return name.replace("?", "_")


def _fmt_seconds(s: float) -> str:
    text = repr(float(s))
    return text[:-2] if text.endswith(".0") else text


class Settings:
    """Where sessions go and which hints they carry. None means 'not given'."""

    __slots__ = ("server", "name", "priority", "iterations", "seconds")

    def __init__(self, server=None, name=None, priority=None, iterations=None, seconds=None):
        self.server = server
        self.name = name
        self.priority = priority
        self.iterations = iterations
        self.seconds = seconds

    def replace(self, **changes) -> "Settings":
        values = {k: getattr(self, k) for k in self.__slots__}
        values.update({k: v for k, v in changes.items() if v is not None})
        return Settings(**values)

    @property
    def target(self) -> str:
        return "grpc://" + (self.server or DEFAULT_SERVER)

    def job_name(self) -> str:
        return self.name if self.name is not None else default_job_name()

    def metadata_name(self) -> str:
        """The session_metadata.name the server parses: 'NAME?priority=P&iterations=N&seconds=S'."""
        query = []
        if self.priority is not None:
            query.append(f"priority={self.priority}")
        if self.iterations is not None:
            query.append(f"iterations={self.iterations}")
        if self.seconds is not None:
            query.append(f"seconds={_fmt_seconds(self.seconds)}")
        name = self.job_name()
        return name + ("?" + "&".join(query) if query else "")

    def __repr__(self):
        return "Settings(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def validated(server=None, name=None, priority=None, iterations=None, seconds=None,
              sources: dict | None = None) -> Settings:
    """Settings from raw values (strings from the environment or Python values); raises SalusConfigError."""
    src = sources or {}
    return Settings(
        server=None if server in (None, "") else normalize_server(server, src.get("server", "server")),
        name=None if name in (None, "") else check_name(name, src.get("name", "name")),
        priority=None if priority in (None, "") else check_priority(priority, src.get("priority", "priority")),
        iterations=None if iterations in (None, "") else check_iterations(
            iterations, src.get("iterations", "iterations")),
        seconds=None if seconds in (None, "") else check_seconds(seconds, src.get("seconds", "seconds")),
    )


_ENV_SOURCES = {"server": ENV_SERVER, "name": ENV_NAME, "priority": ENV_PRIORITY,
                "iterations": ENV_ITERATIONS, "seconds": ENV_SECONDS}


def from_env(environ=None) -> Settings:
    env = os.environ if environ is None else environ
    return validated(server=env.get(ENV_SERVER), name=env.get(ENV_NAME), priority=env.get(ENV_PRIORITY),
                     iterations=env.get(ENV_ITERATIONS), seconds=env.get(ENV_SECONDS), sources=_ENV_SOURCES)


def to_env(settings: Settings) -> dict:
    """The environment variables that reproduce these settings in a child process."""
    env = {}
    if settings.server is not None:
        env[ENV_SERVER] = settings.server
    if settings.name is not None:
        env[ENV_NAME] = settings.name
    if settings.priority is not None:
        env[ENV_PRIORITY] = str(settings.priority)
    if settings.iterations is not None:
        env[ENV_ITERATIONS] = str(settings.iterations)
    if settings.seconds is not None:
        env[ENV_SECONDS] = _fmt_seconds(settings.seconds)
    return env


def eager_enabled(environ=None) -> bool:
    """False when SALUS_EAGER is 0 / false / no / off: eager work then stays local."""
    env = os.environ if environ is None else environ
    return env.get(ENV_EAGER, "").strip().lower() not in _FALSE


# salus.configure() overrides, applied on top of the environment.
_overrides = Settings()


def set_overrides(settings: Settings) -> None:
    global _overrides
    _overrides = settings


def current() -> Settings:
    """Environment settings with salus.configure() overrides applied (raises SalusConfigError)."""
    base = from_env()
    o = _overrides
    return base.replace(server=o.server, name=o.name, priority=o.priority, iterations=o.iterations,
                        seconds=o.seconds)
