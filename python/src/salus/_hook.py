"""The startup hook: waits for TensorFlow to be imported, then routes its work to the server.

salus_tf.pth (top of site-packages) calls install_from_env() only when SALUS_SERVER is set (before it, with
SALUS_TOKEN set, _token.apply_env(), whether or not SALUS_SERVER is). This module never imports TensorFlow: a
meta-path finder watches for two modules and acts right after each has run:

- `tensorflow.python.client.session` (every way of importing TensorFlow or tf-keras loads it): BaseSession
  is patched so graph sessions go to the master front end (_patch);
- `tensorflow`, the top-level package, once its import has completed: Python functions that ops call back
  are served to the server (_callbacks), and the eager context is armed to connect to the server with
  TensorFlow's remote-eager protocol (_eager; not with SALUS_EAGER=0).
"""

from __future__ import annotations

import sys

from . import _config
from ._log import warn as _warn

SESSION_MODULE = "tensorflow.python.client.session"
TF_MODULE = "tensorflow"
_WATCHED = (SESSION_MODULE, TF_MODULE)

_installed = False
_from_env_done = False


class _PatchingLoader:
    """Wraps the real loader of the session module; patches the module once it has executed."""

    def __init__(self, real, fullname):
        self._real = real
        self._fullname = fullname

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        if self._fullname == SESSION_MODULE:
            _on_session_module(module)
        else:
            _on_tensorflow_module(module)

    def __getattr__(self, name):  # get_source, get_code, get_filename, is_package, ...
        return getattr(self._real, name)


class _SessionModuleFinder:
    """sys.meta_path entry that only answers for the watched modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None

    def invalidate_caches(self):
        pass


def _on_session_module(module) -> None:
    try:
        from . import _patch
        _patch.patch_session_module(module)
    except Exception as e:  # never break the user's TensorFlow import
        _warn(f"could not route TensorFlow sessions to the Salus server ({type(e).__name__}: {e}); "
              f"sessions run locally")


def _on_tensorflow_module(module) -> None:
    try:
        from . import _callbacks
        _callbacks.install()
    except Exception as e:  # never break the user's TensorFlow import
        _warn(f"could not serve this script's Python functions to the Salus server ({type(e).__name__}: {e})")
    try:
        from . import _eager
        _eager.on_tensorflow_imported()
    except ConnectionError:  # TensorFlow was already in use and the server is unreachable: say so
        raise
    except Exception as e:  # never break the user's TensorFlow import
        _warn(f"could not route TensorFlow eager work to the Salus server ({type(e).__name__}: {e}); "
              f"it runs locally")


def _imported(name: str):
    """The module if its import has completed (not while it is still executing)."""
    module = sys.modules.get(name)
    if module is None:
        return None
    spec = getattr(module, "__spec__", None)
    if spec is not None and getattr(spec, "_initializing", False):
        return None
    return module


def install() -> None:
    """Routes sessions and eager work to the server from now on (idempotent; TensorFlow may or may not be
    imported yet)."""
    global _installed
    if _installed:
        return
    _installed = True
    session_module = _imported(SESSION_MODULE)
    tf_module = _imported(TF_MODULE)
    if session_module is None or tf_module is None:
        sys.meta_path.insert(0, _SessionModuleFinder())
    if session_module is not None:
        _on_session_module(session_module)
    if tf_module is not None:
        _on_tensorflow_module(tf_module)


def install_from_env() -> None:
    """Called by salus_tf.pth when SALUS_SERVER is set (site may process a venv's .pth files twice)."""
    global _from_env_done
    if _from_env_done:
        return
    _from_env_done = True
    try:
        _config.from_env()
    except _config.SalusConfigError as e:
        # Said early; sessions refuse to start with the same message, so nothing silently runs locally.
        _warn(f"error: {e}")
    try:
        install()
    except Exception as e:
        _warn(f"could not install the TensorFlow hook ({type(e).__name__}: {e})")
