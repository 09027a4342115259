"""Run TensorFlow scripts on a shared salus-server.

Without code changes:   SALUS_SERVER=127.0.0.1:5501 python train.py      (or: salus run -- python train.py)

Explicitly:

    import salus
    sess = salus.session(name="resnet", priority=10, iterations=2000)   # a tf.compat.v1.Session on the server

    salus.configure(server="127.0.0.1:5501", name="resnet")   # every graph session from now on goes there,
                                                              # and eager work (if TF's eager context is not
                                                              # connected yet)
    salus.connect_eager(name="resnet", priority=10)           # TF2 eager work / Keras 3 on the server, now

Importing this package is cheap: it imports neither TensorFlow nor gRPC.
"""

from __future__ import annotations

from ._config import DEFAULT_SERVER, SalusConfigError, Settings

__all__ = ["session", "configure", "connect_eager", "settings", "AdminClient", "SalusConfigError", "DEFAULT_SERVER",
           "__version__"]


def _settings_with(server=None, name=None, priority=None, iterations=None, seconds=None) -> Settings:
    from . import _config
    given = _config.validated(server=server, name=name, priority=priority, iterations=iterations,
                              seconds=seconds)
    return _config.current().replace(server=given.server, name=given.name, priority=given.priority,
                                     iterations=given.iterations, seconds=given.seconds)


def settings() -> Settings:
    """The effective settings: SALUS_* environment variables with configure() overrides applied."""
    from . import _config
    return _config.current()


def configure(server: str | None = None, name: str | None = None, priority: int | None = None,
              iterations: int | None = None, seconds: float | None = None, *,
              export: bool = True) -> Settings:
    """Send every TensorFlow graph session this process creates with an empty target to the server.

    The in-code equivalent of SALUS_SERVER / SALUS_JOB_NAME / SALUS_PRIORITY / SALUS_EXPECTED_ITERATIONS /
    SALUS_EXPECTED_SECONDS (arguments left None keep the environment's value; the server defaults to
    SALUS_SERVER, else 127.0.0.1:5501). Works before or after TensorFlow is imported. With export=True the
    values are also written to os.environ so child processes inherit them. Raises SalusConfigError for a
    value the server would refuse.
    """
    import os

    from . import _config, _hook
    new = _settings_with(server, name, priority, iterations, seconds)
    if new.server is None:
        new = new.replace(server=DEFAULT_SERVER)
    old = _config._overrides
    _config.set_overrides(old.replace(server=new.server, name=new.name, priority=new.priority,
                                      iterations=new.iterations, seconds=new.seconds))
    if export:
        os.environ.update(_config.to_env(new))
    _hook.install()
    return new


def connect_eager(server: str | None = None, name: str | None = None, priority: int | None = None,
                  iterations: int | None = None, seconds: float | None = None) -> Settings:
    """Connect TensorFlow's eager context to the server now: TF2 eager ops, tf.function, tf.data and Keras
    (eager) run there from now on, as one job with these hints.

    What the SALUS_SERVER hook does at the first eager op, done explicitly (imports TensorFlow; SALUS_EAGER is
    not consulted). The calling thread's default device becomes /job:worker/replica:0/task:0 (unless it is
    inside a tf.device scope); tensors created before stay where they are. Raises ConnectionError when the
    server cannot be reached and TensorFlow's error when it refuses the eager context. Hint keywords left None
    keep the environment / configure() values; the server defaults to SALUS_SERVER, else 127.0.0.1:5501.
    """
    import tensorflow  # noqa: F401  (the hook, if installed, arms itself; connect() takes over)

    from . import _eager
    s = _settings_with(server, name, priority, iterations, seconds)
    if s.server is None:
        s = s.replace(server=DEFAULT_SERVER)
    _eager.connect(s)
    return s


def session(graph=None, config=None, *, server: str | None = None, name: str | None = None,
            priority: int | None = None, iterations: int | None = None, seconds: float | None = None):
    """A tf.compat.v1.Session on the Salus server, with the job's hints in its config.

    graph and config are those of tf.compat.v1.Session (the config is copied, never modified). Hint keywords
    override the environment / configure() values for this session; a session_metadata name already in
    config is kept when no hint keyword is given.
    """
    import tensorflow as tf

    from . import _patch
    s = _settings_with(server, name, priority, iterations, seconds)
    explicit = any(v is not None for v in (name, priority, iterations, seconds))
    if explicit and config is not None:
        config_copy = type(config)()
        config_copy.CopyFrom(config)
        config_copy.experimental.session_metadata.Clear()
        config = config_copy
    merged = _patch.merged_config(config, s)
    _patch.check_reachable(s.server or DEFAULT_SERVER)
    return tf.compat.v1.Session(s.target, graph=graph, config=merged)


def __getattr__(name):
    # Imported on first use: the startup hook imports this package into every Python process with SALUS_SERVER
    # set, and imports no module it does not need.
    if name == "AdminClient":
        from .admin import AdminClient
        return AdminClient
    if name == "__version__":
        try:
            # Written into the wheel when it is built, from the workspace's Cargo.toml (python/hatch_build.py):
            # the same version as salus-server's.
            from ._version import VERSION
        except ImportError:  # the source tree itself on sys.path, never built
            VERSION = "0+unknown"
        return VERSION
    raise AttributeError(f"module 'salus' has no attribute {name!r}")
