"""Routes TensorFlow graph sessions to the Salus server.

Imported only once TensorFlow's session module has been loaded (by the script). Patching
BaseSession.__init__ covers tf.compat.v1.Session, InteractiveSession, MonitoredTrainingSession (its
session creators build a tf.compat.v1.Session with the master '') and the tf-keras backend session.
"""

from __future__ import annotations

import functools
import os
import socket
import sys

from . import _config

CONNECT_TIMEOUT_S = 5.0

_state = {"patched": False, "sessions": 0, "server_sessions": 0}


def new_metadata_version() -> int:
    """A random non-negative int64 for session_metadata.version.

    TensorFlow refuses a second live session with the same session_metadata (name, version) in one
    process, and every job of a Salus server lives in the server's process: two concurrent jobs with the
    same name (two runs of train.py, or a script with two sessions) would collide on version 0.
    """
    return int.from_bytes(os.urandom(7), "big") or 1


def merged_config(config, settings: "_config.Settings", config_pb2=None):
    """A copy of the script's ConfigProto (or TensorFlow's default one) with the job's hints added.

    The script's settings are kept; a session_metadata name the script set itself wins over the hints.
    """
    if config_pb2 is None:
        from tensorflow.core.protobuf import config_pb2
    if config is None:
        try:
            from tensorflow.python.eager import context
            base = context.context().config  # what BaseSession would use for config=None
        except Exception:
            base = config_pb2.ConfigProto()
    elif isinstance(config, config_pb2.ConfigProto):
        base = config
    else:
        return config  # let TensorFlow raise its own TypeError
    merged = config_pb2.ConfigProto()
    merged.CopyFrom(base)
    meta = merged.experimental.session_metadata
    if not meta.name:
        meta.name = settings.metadata_name()
        meta.version = new_metadata_version()
    return merged


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """TensorFlow's gRPC client waits forever for an unreachable master; fail fast with a clear message."""
    host, port = _config.split_host_port(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise ConnectionError(
            f"salus: cannot reach salus-server at {address} ({reason}). Start it with "
            f"`salus-server --listen {address}`, point SALUS_SERVER at a running server, or unset "
            f"SALUS_SERVER to run TensorFlow locally.") from None


def patch_session_module(module) -> None:
    base = module.BaseSession
    original = base.__init__
    if getattr(original, "_salus_original", None) is not None:
        return
    config_pb2 = module.config_pb2

    @functools.wraps(original)
    def __init__(self, target="", graph=None, config=None):
        if not target:
            try:
                settings = _config.current()
                if settings.server:  # unset when the script removed SALUS_SERVER itself: stay local
                    config = merged_config(config, settings, config_pb2)
                    check_reachable(settings.server)
                    target = settings.target
                    _state["server_sessions"] += 1
            except Exception:
                self._session = None  # BaseSession.__del__ reads it
                self._closed = True
                raise
        _state["sessions"] += 1
        original(self, target, graph, config)

    __init__._salus_original = original
    base.__init__ = __init__
    _state["patched"] = True


def stats() -> dict:
    """How many sessions this process created (all / sent to the server by the hook), and where eager work
    goes (eager: None, "pending", "connected", "off", "failed" or "graph")."""
    out = {"sessions": _state["sessions"], "server_sessions": _state["server_sessions"]}
    eager = sys.modules.get("salus._eager")
    out.update(eager.stats() if eager is not None else {"eager": None, "eager_server": None})
    return out
