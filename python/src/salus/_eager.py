"""Routes TF2 eager work (eager ops, tf.function, tf.data, Keras 3 / tf-keras in eager mode) to the server.

TensorFlow's remote-eager protocol (tensorflow.eager.EagerService) does it: the process's eager context gets a
ServerDef naming the server as job "worker" task 0 and this process as job "localhost", exactly what
tf.config.experimental_connect_to_cluster builds (tensorflow/python/eager/remote.py), and the importing thread's
default device becomes /job:worker/replica:0/task:0. The ServerDef travels to the server in
EagerService/CreateContext; its default_session_config.experimental.session_metadata.name carries the job name
and hints in the format graph sessions use (settings.metadata_name()).

The automatic path (SALUS_SERVER set, `import tensorflow` completed) is lazy: it only stores what to do and
connects when TensorFlow initializes its eager context (the first eager op, usually), so that
tf.config.threading / set_visible_devices / set_memory_growth calls right after the import keep working and
graph-only scripts (tf.compat.v1.disable_eager_execution()) never open an eager context on the server. If the
server cannot be reached that first op fails with check_reachable's message; if the server refuses the context
(e.g. it does not implement the eager protocol) the script warns once and its eager work runs locally.

Imported only once TensorFlow has been imported. Private TensorFlow attributes are guarded: TF 2.16 - 2.21.
"""

from __future__ import annotations

import atexit
import copy
import os
import sys
import threading

from . import _config
from ._log import warn as _warn

SERVER_JOB = "worker"
LOCAL_JOB = "localhost"
SERVER_TASK = f"/job:{SERVER_JOB}/replica:0/task:0"
# connect_to_cluster enters ops.device(SERVER_TASK), which merges it into the context's first device, the local
# CPU:0 (and needs an initialized context). The full name is needed: EagerTensor() copies to an exact device.
# Salus shares GPUs, so the default is the server's first GPU when it has one (SALUS_EAGER_DEVICE overrides);
# the server places ops without a GPU kernel on its CPU (soft placement).
SERVER_DEVICE = SERVER_TASK + "/device:CPU:0"
ENV_DEVICE = "SALUS_EAGER_DEVICE"

# mode: None (nothing done), "pending" (armed, connects at context initialization), "connected",
# "off" (SALUS_EAGER=0), "failed" (connection refused: eager work runs locally), "graph" (eager disabled).
_state = {"mode": None, "server": None, "reason": "", "context": None, "original": None, "thread": None,
          "atexit": False, "warned": False}
_lock = threading.RLock()


def mode() -> str | None:
    return _state["mode"]


def eager_default() -> bool:
    """Eager execution enabled for the process (not just for this thread: graph scopes do not count)."""
    from tensorflow.python.eager import context
    mode_ = getattr(context, "default_execution_mode", None)
    if mode_ is None:
        return context.executing_eagerly()
    return mode_ == context.EAGER_MODE


def build_server_def(settings: "_config.Settings", base_config=None):
    """The ServerDef connect_to_cluster would build for {"worker": [server]}, plus the job's hints.

    cluster: job "worker" task 0 at the server, job "localhost" task 0 on an unused local port; job_name
    "localhost", task 0, protocol "grpc"; default_session_config: a copy of the eager context's config with
    experimental.collective_group_leader "/job:worker/replica:0/task:0" and session_metadata {name: the hints,
    version: random}.
    """
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context

    from ._patch import new_metadata_version
    server = settings.server or _config.DEFAULT_SERVER
    config = copy.deepcopy(base_config if base_config is not None else context.context().config)
    config.experimental.collective_group_leader = SERVER_TASK
    meta = config.experimental.session_metadata
    if not meta.name:  # a name the script set in its own config wins, as for graph sessions
        meta.name = settings.metadata_name()
        meta.version = new_metadata_version()
    server_def = tensorflow_server_pb2.ServerDef(job_name=LOCAL_JOB, task_index=0, protocol="grpc",
                                                 default_session_config=config)
    worker = server_def.cluster.job.add()
    worker.name = SERVER_JOB
    worker.tasks[0] = server
    local = server_def.cluster.job.add()
    local.name = LOCAL_JOB
    local.tasks[0] = f"localhost:{pywrap_tfe.TF_PickUnusedPortOrDie()}"
    return server_def


def server_device(server: str | None) -> str:
    """The server device new ops default to: SALUS_EAGER_DEVICE (e.g. GPU:1), else the server's first GPU
    if its GetStatus lists one, else its CPU:0."""
    override = os.environ.get(ENV_DEVICE, "").strip()
    if override:
        return f"{SERVER_TASK}/device:{override.lstrip('/').removeprefix('device:').upper()}"
    if server:
        try:
            import grpc
            from . import _proto, _token
            # The tenant token in the user agent, as on TensorFlow's own channels to the server.
            with grpc.insecure_channel(server, options=_token.grpc_options()) as channel:
                raw = channel.unary_unary("/tensorflow.WorkerService/GetStatus")(b"", timeout=5)
            devices = _proto.decode("GetStatusResponse", raw)["device_attributes"]
            if any(d["device_type"] == "GPU" for d in devices):
                return f"{SERVER_TASK}/device:GPU:0"
        except Exception:  # unreachable or not a worker: the connection reports it; default to CPU
            pass
    return SERVER_DEVICE


def _set_default_device(ctx) -> bool:
    """Makes the server the calling thread's default device unless the thread is inside a device scope."""
    if ctx.device_name:
        return False
    from tensorflow.python.framework import device_spec
    if hasattr(ctx, "_set_device"):
        # What ops.device(SERVER_TASK) would set, without initializing the context now.
        device = _state.get("device") or server_device(_state.get("server"))
        _state["device"] = device
        ctx._set_device(device, device_spec.DeviceSpecV2.from_string(device))
    else:
        from tensorflow.python.framework import ops
        ops.device(SERVER_TASK).__enter__()
    return True


def _reset_default_device(ctx) -> None:
    """Undoes _set_default_device on the calling thread (when the thread still has that default)."""
    try:
        if ctx.device_name == _state.get("device") and hasattr(ctx, "_set_device"):
            from tensorflow.python.framework import device_spec
            ctx._set_device("", device_spec.DeviceSpecV2.from_string(""))
    except Exception:
        pass


def _drop_server_def(ctx) -> None:
    if hasattr(ctx, "_server_def"):
        ctx._server_def = None


def _register_atexit() -> None:
    if not _state["atexit"]:
        _state["atexit"] = True
        atexit.register(warn_if_local_work)
        atexit.register(report_unwaited_failure)


# --- the automatic path -----------------------------------------------------------------------------------

def on_tensorflow_imported() -> None:
    """Called by the hook once `import tensorflow` has completed (or at install() when it already had)."""
    with _lock:
        if _state["mode"] is not None:
            return
        _register_atexit()
        settings = _config.current()
        if not settings.server:
            return
        _state["server"] = settings.server
        if not _config.eager_enabled():
            _state["mode"] = "off"
            return
        if not eager_default():
            _state["mode"] = "graph"
            return
        from tensorflow.python.eager import context
        ctx = context.context()
        if getattr(ctx, "_initialized", False):
            # TensorFlow was imported and used before salus.install()/configure(): connect now.
            try:
                _connect_now(ctx, settings)
            except ConnectionError:
                _state["mode"] = "failed"
                raise
            return
        _arm(ctx)


def _arm(ctx) -> None:
    cls = type(ctx)
    original = cls.ensure_initialized
    if getattr(original, "_salus_original", None) is not None:
        original = original._salus_original

    def ensure_initialized(self):
        if self._initialized or self is not _state["context"]:
            return original(self)
        return _initialize(self, original)

    ensure_initialized._salus_original = original
    _state.update(mode="pending", context=ctx, original=original, thread=threading.get_ident())
    cls.ensure_initialized = ensure_initialized
    _set_default_device(ctx)


def _disarm(ctx) -> None:
    original = _state["original"]
    if original is not None:
        type(ctx).ensure_initialized = original  # no wrapper on TensorFlow's per-op path once connected
    _state.update(context=None, original=None)


def _initialize(ctx, original):
    with _lock:
        if ctx._initialized or _state["mode"] != "pending":
            return original(ctx)
        _disarm(ctx)
        try:
            settings = _config.current()
            if not settings.server or not eager_default():
                _state["mode"] = "graph" if settings.server else None
                _reset_default_device(ctx)
                return original(ctx)
            if not _config.eager_enabled():
                _state["mode"] = "off"
                _reset_default_device(ctx)
                return original(ctx)
            from ._patch import check_reachable
            try:
                check_reachable(settings.server)
            except ConnectionError:
                _state.update(mode="failed", reason="unreachable")
                _reset_default_device(ctx)
                raise
            # Built now, not at import: the config has the script's tf.config changes made since.
            server_def = build_server_def(settings, ctx.config)
            ctx.set_server_def(server_def)
            try:
                result = original(ctx)
            except Exception as e:
                _drop_server_def(ctx)
                _reset_default_device(ctx)
                _state.update(mode="failed", reason=f"{type(e).__name__}: {_one_line(e)}")
                _warn(f"could not connect TensorFlow's eager context to the Salus server at {settings.server} "
                      f"({_state['reason']}); eager work runs locally")
                return original(ctx)
            _state.update(mode="connected", server=settings.server)
            _serve_callbacks()
            return result
        except ConnectionError:
            raise
        except Exception as e:  # never break the script over the adapter
            _state.update(mode="failed", reason=f"{type(e).__name__}: {_one_line(e)}")
            _drop_server_def(ctx)
            _reset_default_device(ctx)
            _warn(f"could not route eager work to the Salus server ({_state['reason']}); it runs locally")
            return original(ctx)


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text[:limit] + ("..." if len(text) > limit else "")


# --- the explicit path --------------------------------------------------------------------------------

def _connect_now(ctx, settings) -> None:
    from ._patch import check_reachable
    check_reachable(settings.server or _config.DEFAULT_SERVER)
    if _state["context"] is ctx:
        _disarm(ctx)
    server_def = build_server_def(settings, ctx.config)
    try:
        ctx.set_server_def(server_def)
        ctx.ensure_initialized()
    except Exception:
        _drop_server_def(ctx)
        raise
    _set_default_device(ctx)
    _state.update(mode="connected", server=settings.server or _config.DEFAULT_SERVER)
    _serve_callbacks()


def _serve_callbacks() -> None:
    """Reading a pending result waits without the interpreter lock from now on, so that the Python callbacks
    of the op it waits for can run in this process (_callbacks)."""
    try:
        from . import _callbacks
        _callbacks.release_lock_while_waiting()
        _callbacks.run_eager_python_here()
        _callbacks.route_eager_ops()
    except Exception as e:  # never break the script over the adapter
        _warn(f"could not prepare this script to run the Python of its ops that run on the server "
              f"({type(e).__name__}: {e}); a step that calls Python may wait forever")


def connect(settings: "_config.Settings") -> None:
    """salus.connect_eager(): connect the eager context now; errors are raised, not warned about."""
    from tensorflow.python.eager import context
    with _lock:
        _register_atexit()
        if not eager_default():
            raise RuntimeError("salus.connect_eager() needs eager execution (it is disabled in this process)")
        ctx = context.context()
        try:
            _connect_now(ctx, settings)
        except Exception as e:
            _state.update(mode="failed", reason=f"{type(e).__name__}: {_one_line(e)}")
            raise


# --- at exit ---------------------------------------------------------------------------------------------

def _did_eager_work() -> bool:
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is None:
        return False
    try:
        if not eager_default():
            return False
        ctx = context.context()
        return bool(getattr(ctx, "_initialized", True))
    except Exception:
        return False


def report_unwaited_failure() -> None:
    """At exit: TensorFlow's client does not wait for an op without outputs (a file write), and the server
    reports such an op's failure by the next call. When the script made none, say it here."""
    if _state["mode"] != "connected":
        return
    try:
        from tensorflow.python.eager import context
        ctx = context.context()
        if getattr(ctx, "_initialized", False):
            ctx.sync_executors()
    except Exception as e:
        _warn(f"error: an op of this script failed on the Salus server after its last call, which could not "
              f"report it: {type(e).__name__}: {_one_line(e, 1000)}")


def warn_if_local_work() -> None:
    """One warning at exit when the script's eager work ran locally although SALUS_SERVER was set."""
    if _state["warned"]:
        return
    m = _state["mode"]
    if m not in ("off", "failed") or not _did_eager_work():
        return
    _state["warned"] = True
    server = _state["server"] or _config.DEFAULT_SERVER
    why = ("SALUS_EAGER=0" if m == "off" else
           f"the eager connection to the Salus server failed ({_state['reason']})")
    _warn(f"warning: {why}, so this script's TF2 eager work (eager ops, tf.function, tf.data, Keras 3 / tf-keras "
          f"in eager mode) ran locally in this process, not on the Salus server at {server}. Graph sessions "
          f"(tf.compat.v1.Session, MonitoredTrainingSession) still run on the server.")


def stats() -> dict:
    return {"eager": _state["mode"], "eager_server": _state["server"]}
