"""Python callbacks: this process serves the Python of its ops that run on the server.

`tf.py_function`, `tf.numpy_function`, `Dataset.from_generator`, Keras's `PyDataset` and generator inputs compile
to ops (PyFunc, PyFuncStateless, EagerPyFunc) whose `token` attribute names a Python function in this process's
registry (tensorflow.python.ops.script_ops._py_funcs). Such an op runs on the server as part of its step, in a
graph session, a tf.function or a tf.data pipeline alike; the server's kernel for it sends the op's inputs here
and waits, and this process runs the function and answers with its outputs (or its exception's code and
message), as TensorFlow's own kernel would call into the interpreter in-process.

- Tokens: every token the registry hands out gets the suffix `@salus:<client id>`, a random id of this process,
  so the server knows whom to call. The local registry looks tokens up as they are, so ops that run here
  (a session or eager context that is not connected) work as before.
- The stream: `salus.v1.PythonCallbacks/Serve` (proto/salus/v1/callbacks.proto), opened on a daemon thread when
  the script creates its first Python op, and reopened if it drops. Its first message names the client id.
- Calls run on a small thread pool under this process's CPU device (a callback's own TensorFlow ops run here:
  sent to the server, they would queue behind the step that waits for them).

- Waiting without the interpreter lock: a remote function call returns before the server has run it, and
  TensorFlow reads a pending result's device, shape or value (`.device`, `.shape`, `.numpy()`) while holding the
  interpreter lock, so a callback that step needs could never run here. Once the eager context is connected
  (`release_lock_while_waiting`), those accessors first wait for the thread's pending ops through the call
  TensorFlow itself uses for this, which releases the lock (TFE_ExecutorWaitForAllPendingNodes).

Imported once TensorFlow has been imported (the hook's `tensorflow` step). The encoding of the two messages is
written out here (see _proto for why the adapter does not generate protobuf code).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import queue
import secrets
import threading
import time
import traceback

from . import _config, _token
from ._log import warn as _warn

TOKEN_MARK = "@salus:"
SERVE_METHOD = "/salus.v1.PythonCallbacks/Serve"
CLIENT_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
# Callbacks run concurrently as in-process kernels would (a dataset map with parallel calls, several sessions).
MAX_CONCURRENT_CALLS = 16
_RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
# A callback whose thread has waited this long for a tensor on the server is waiting for the step that waits for
# it (a copy of an existing value is answered at once, even while that step runs): its call is answered with
# an error so that the step fails instead of both waiting forever. SALUS_CALLBACK_SERVER_WAIT_S overrides.
SERVER_WAIT_LIMIT_S = 20.0
_WATCH_INTERVAL_S = 0.5
# A thread that has waited this long for its eager context's pending ops, with no callback of this process
# running, has the server asked whether anything can still end the wait (PythonCallbacks/EndStalledWait),
# and again at this interval while it waits. SALUS_STALLED_WAIT_CHECK_S overrides.
STALLED_WAIT_CHECK_S = 30.0
END_STALLED_WAIT_METHOD = "/salus.v1.PythonCallbacks/EndStalledWait"
_REFERENCE_DTYPES = (20, 21)  # DT_RESOURCE, DT_VARIANT

# tensorflow.error.Code for the exceptions TensorFlow's own kernel maps (python/lib/core/py_func.cc).
_UNKNOWN, _INVALID_ARGUMENT, _RESOURCE_EXHAUSTED, _ABORTED, _OUT_OF_RANGE, _UNIMPLEMENTED, _INTERNAL = (
    2, 3, 8, 10, 11, 12, 13)

_state = {"installed": False, "started": False, "client": secrets.token_hex(16), "stopping": False,
          "call": None}
_lock = threading.Lock()
_thread = threading.local()  # serving: this thread runs callbacks (its tensors are local and ready)
# Calls being answered: call id -> _Outstanding; per serving thread (ident), since when it waits for the
# server; per other thread, since when it waits for its context's pending ops (settle) and which context. All
# read by the watchdog.
_outstanding: dict = {}
_server_waits: dict = {}
_settle_waits: dict = {}


def client_id() -> str:
    return _state["client"]


def install() -> None:
    """Marks every token TensorFlow's Python-function registry hands out from now on; the stream opens with the
    first one. Idempotent."""
    with _lock:
        if _state["installed"]:
            return
        from tensorflow.python.ops import script_ops
        registry = script_ops._py_funcs
        next_token = registry._next_unique_token

        def marked_token():
            _start()
            return f"{next_token()}{TOKEN_MARK}{_state['client']}"

        registry._next_unique_token = marked_token
        _state["installed"] = True


def settle() -> None:
    """Waits for this thread's pending eager ops with the interpreter lock released (not in a callback thread,
    whose tensors are local and ready). An error of a pending op is raised here, with its type, as the
    accessor that called this would have raised it, and only here."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context
    ctx = context.context()
    if ctx._context_handle is not None and not getattr(_thread, "serving", False):
        executor = pywrap_tfe.TFE_ContextGetExecutorForThread(ctx._context_handle)
        ident = threading.get_ident()
        _settle_waits[ident] = (time.monotonic(), ctx._context_handle)
        try:
            pywrap_tfe.TFE_ExecutorWaitForAllPendingNodes(executor)
        except Exception:
            # Raised once, here, as in-process; the executor would otherwise keep it and raise it again at
            # every later wait.
            _after_error()
            raise
        finally:
            _settle_waits.pop(ident, None)


def _after_error() -> None:
    """What follows an op's error that reached the script, so that it reaches it once and leaves nothing broken:

    - The thread's executor forgets it. A remote op's error is kept by the executor as well as raised (in-process
      no executor keeps an op's error); it would be raised again at the next wait or op. An error of another
      op that nobody has read yet goes with it; that op's outputs still raise it when used, as in-process.
    - TensorFlow's cache of scalar constants is emptied. A step's error ends the request stream, and every
      request queued behind it fails with that error, the copy of a Python number to the server among them
      (`x + 1` right after the failing call): cached, that poisoned copy would fail every later op using the
      same number on the server, for the rest of the script."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context
    ctx = context.context()
    if ctx._context_handle is not None:
        executor = pywrap_tfe.TFE_ContextGetExecutorForThread(ctx._context_handle)
        pywrap_tfe.TFE_ExecutorClearError(executor)
    pywrap_tfe.TFE_ClearScalarCache()


def run_eager_python_here() -> None:
    """An eager `tf.py_function` / `tf.numpy_function` (outside any tf.function) runs in this process with its
    inputs copied here: TensorFlow pins the op to this process's CPU, and an op here with inputs on the server
    would be split between the two (RunComponentFunction, which the server does not serve). Idempotent."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import gen_script_ops

    for name in ("eager_py_func", "py_func", "py_func_stateless"):
        op = getattr(gen_script_ops, name, None)
        if op is None or hasattr(op, "_salus_original"):
            continue

        def wrapper(*args, _op=op, **kwargs):
            if not context.executing_eagerly():
                return _op(*args, **kwargs)
            args = tuple(_here(a) for a in args)
            kwargs = {k: _here(v) for k, v in kwargs.items()}
            with ops.device(CLIENT_DEVICE):
                return _op(*args, **kwargs)

        wrapper._salus_original = op
        setattr(gen_script_ops, name, wrapper)


def _here(value):
    """`value` with every EagerTensor in it (in lists and tuples too) on this process."""
    from tensorflow.python.framework import ops
    if isinstance(value, (list, tuple)):
        return type(value)(_here(v) for v in value)
    # A resource or variant is a reference to state on the server: it stays there, and so does its op.
    if (isinstance(value, ops.EagerTensor) and value._datatype_enum() not in _REFERENCE_DTYPES
            and "/job:localhost/" not in value.device):
        from tensorflow.python.framework import constant_op
        # Through the value, not _copy_to_device: reading a value waits with the interpreter lock released
        # (a copy waits holding it, and nothing else in this process, the watchdog included, would run).
        with ops.device(CLIENT_DEVICE):
            return constant_op.constant(value._numpy(), dtype=value.dtype)
    return value


def _on_server(values) -> bool:
    from tensorflow.python.framework import ops
    if isinstance(values, (list, tuple)):
        return any(_on_server(v) for v in values)
    return isinstance(values, ops.EagerTensor) and "/job:localhost/" not in values.device


def _waiting_for_server(read, *args):
    """`read(*args)`, marked for the watchdog as this serving thread waiting for the server."""
    if not getattr(_thread, "serving", False):
        return read(*args)
    ident = threading.get_ident()
    if ident in _server_waits:  # an outer wait is marked already (an op reading its inputs' devices)
        return read(*args)
    _server_waits[ident] = time.monotonic()
    try:
        return read(*args)
    finally:
        _server_waits.pop(ident, None)


def route_eager_ops() -> None:
    """Wraps the two calls every eager op and function call goes through (TFE_Py_FastPathExecute, and
    execute.quick_execute / execute_with_cancellation), for two jobs. Idempotent.

    - A callback thread's ops get their server-resident inputs copied here first. A callback's Python may hold
      tensors that live on the server (a generator yielding tensors the script made, a SparseTensor among
      them); TensorFlow would run an op mixing local and remote inputs as a function split between the two
      processes, whose server part is registered and run behind the step that waits for this very callback
      (and the server does not serve component functions at all). Copies are plain reads of existing values,
      which the server answers while the step runs. Ops on other threads pass through untouched.
    - An error an op raises is raised once (_after_error). When the server answers a failing step before the
      call returns (a busy client), the call raises it, and the executor would raise it again at the next
      wait: at a pending value's accessor (settle), outside the `except` that handled it (Keras ends an epoch
      on the OutOfRangeError of its step, then reads the last step's logs), or at the thread's next op.
    Also context.async_wait's call (Context.sync_executors), for the cache of _after_error."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context, core, execute
    from tensorflow.python.framework import errors

    op_errors = (errors.OpError, core._NotOkStatusException)

    def raised_once(call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except op_errors:
            _after_error()
            raise

    fast = pywrap_tfe.TFE_Py_FastPathExecute
    if getattr(fast, "_salus_original", None) is None:
        def fast_path_execute(*args):
            # (ctx, op name, name, inputs and attrs...): attrs are Python values, never server tensors.
            if getattr(_thread, "serving", False):
                args = args[:3] + tuple(_here(a) for a in args[3:])
                if _on_server(args[3:]):  # a resource's op runs on the server, in the context's order
                    return _waiting_for_server(raised_once, fast, *args)
            return raised_once(fast, *args)

        fast_path_execute._salus_original = fast
        pywrap_tfe.TFE_Py_FastPathExecute = fast_path_execute

    quick = execute.quick_execute
    if getattr(quick, "_salus_original", None) is None:
        def quick_execute(op_name, num_outputs, inputs, attrs, ctx, name=None):
            if getattr(_thread, "serving", False):
                inputs = _here(list(inputs))
                if _on_server(inputs):
                    return _waiting_for_server(raised_once, quick, op_name, num_outputs, inputs, attrs, ctx,
                                               name)
            return raised_once(quick, op_name, num_outputs, inputs, attrs, ctx, name)

        quick_execute._salus_original = quick
        # `execute` is the name generated op wrappers call; `quick_execute` the one functions call.
        execute.quick_execute = execute.execute = quick_execute

    cancelable = execute.execute_with_cancellation
    if getattr(cancelable, "_salus_original", None) is None:
        def execute_with_cancellation(*args, **kwargs):  # a function called with a cancellation manager
            return raised_once(cancelable, *args, **kwargs)

        execute_with_cancellation._salus_original = cancelable
        execute.execute_with_cancellation = execute_with_cancellation

    sync = context.Context.sync_executors
    if getattr(sync, "_salus_original", None) is None:
        def sync_executors(self):  # context.async_wait(); its C call forgets the executors' errors itself
            try:
                return sync(self)
            except op_errors:
                pywrap_tfe.TFE_ClearScalarCache()
                raise

        sync_executors._salus_original = sync
        context.Context.sync_executors = sync_executors


def release_lock_while_waiting() -> None:
    """Makes EagerTensor's device, shape, rank and value accessors wait for the thread's pending ops with the
    interpreter lock released first (see the module docstring). Idempotent."""
    from tensorflow.python.framework import ops
    tensor_type = ops.EagerTensor
    if getattr(tensor_type, "_salus_settles", False):
        return
    from tensorflow.python.eager import core

    def read_once(read, tensor):
        try:
            return read(tensor)
        except Exception as e:  # a value poisoned by a failed op: its error, raised once (settle)
            _after_error()
            if isinstance(e, ValueError):
                # TensorFlow reads a poisoned value's device or shape as a ValueError; the op's own error
                # (what in-process the op's call raised) is the value's status.
                try:
                    tensor._num_elements()
                except core._NotOkStatusException as status:
                    raise core._status_to_exception(status) from None
                except Exception:
                    pass
            raise

    for name in ("_numpy", "_shape_tuple", "_rank"):
        def settled(self, _original=getattr(tensor_type, name)):
            if getattr(_thread, "serving", False):
                return _waiting_for_server(_original, self)
            settle()
            return read_once(_original, self)
        setattr(tensor_type, name, settled)
    device = tensor_type.device

    def settled_device(self):
        if getattr(_thread, "serving", False):
            return _waiting_for_server(device.__get__, self)
        settle()
        return read_once(device.__get__, self)

    tensor_type.device = property(settled_device, doc=device.__doc__)
    tensor_type._salus_settles = True
    start_watchdog()


# --- the stream -----------------------------------------------------------------------------------------------

def _start() -> None:
    with _lock:
        if _state["started"]:
            return
        _state["started"] = True
    atexit.register(_stop)
    threading.Thread(target=_serve_forever, name="salus-python-callbacks", daemon=True).start()
    start_watchdog()


def start_watchdog() -> None:
    """The thread that bounds waits for the server (_watch_server_waits): with the callback stream, and once the
    eager context is connected (a script without Python ops has waits too). Idempotent."""
    with _lock:
        if _state.get("watchdog"):
            return
        _state["watchdog"] = True
    threading.Thread(target=_watch_server_waits, name="salus-callback-watchdog", daemon=True).start()


def _stop() -> None:
    _state["stopping"] = True
    call = _state["call"]
    if call is not None:
        call.cancel()


def _serve_forever() -> None:
    import grpc
    failures = 0
    pool = concurrent.futures.ThreadPoolExecutor(MAX_CONCURRENT_CALLS, thread_name_prefix="salus-callback",
                                                 initializer=_serving_thread)
    while not _state["stopping"]:
        server = _config.current().server or _config.DEFAULT_SERVER
        replies: queue.SimpleQueue = queue.SimpleQueue()
        replies.put(_encode_reply(client=_state["client"]))
        options = _token.grpc_options() + [("grpc.max_receive_message_length", -1),
                                           ("grpc.max_send_message_length", -1)]
        try:
            with grpc.insecure_channel(server, options=options) as channel:
                call = channel.stream_stream(SERVE_METHOD)(_outgoing(replies))
                _state["call"] = call
                for raw in call:
                    failures = 0
                    pool.submit(_answer, replies, raw)
        except Exception as e:  # grpc.RpcError, a closed channel at exit
            # Quietly: the server reports an op whose script it cannot reach, at that op. Retried: the server
            # may be restarting; not a server without the service (TensorFlow's own).
            code = getattr(e, "code", None)
            if _state["stopping"] or (callable(code) and code() == grpc.StatusCode.UNIMPLEMENTED):
                break
        finally:
            _state["call"] = None
            replies.put(None)
        failures += 1
        time.sleep(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS)) - 1])
    pool.shutdown(wait=False, cancel_futures=True)


def _serving_thread() -> None:
    """A callback thread gets an executor of its own: its ops must not queue behind the thread that waits for
    the step that called it (the default executor is shared by threads that set none)."""
    from tensorflow.python.eager import context, executor
    _thread.serving = True
    context.context().executor = executor.new_executor(enable_async=False)


def _outgoing(replies: queue.SimpleQueue):
    while True:
        item = replies.get()
        if item is None:
            return
        yield item


def _answer(replies: queue.SimpleQueue, raw: bytes) -> None:
    try:
        call, token, inputs, op, node = _decode_call(raw)
    except Exception as e:
        _warn(f"a malformed Python callback from the server was ignored ({e})")
        return
    _outstanding[call] = _Outstanding(token, op, node, threading.get_ident(), replies)
    try:
        outputs = _run(token, inputs)
        replies.put(_encode_reply(call=call, outputs=outputs))
    except BaseException as e:  # the function's exception goes to the op, as in-process
        replies.put(_encode_reply(call=call, code=_code_of(e), message=_message_of(e)))
    finally:
        # A call the watchdog answered already: the server drops this second reply.
        _outstanding.pop(call, None)


class _Outstanding:
    """A call being answered, as the watchdog sees it."""

    def __init__(self, token: str, op: str, node: str, thread: int, replies: queue.SimpleQueue):
        self.token, self.op, self.node, self.thread, self.replies = token, op, node, thread, replies


def server_wait_limit() -> float:
    return _seconds_from_env("SALUS_CALLBACK_SERVER_WAIT_S", SERVER_WAIT_LIMIT_S)


def stalled_wait_check() -> float:
    return _seconds_from_env("SALUS_STALLED_WAIT_CHECK_S", STALLED_WAIT_CHECK_S)


def _seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from the environment; the default (said once) for anything else."""
    import os
    raw = os.environ.get(name, "")
    try:
        seconds = float(raw) if raw else default
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        _warn(f"{name}={raw!r} is not a positive number of seconds; using {default:g}")
        seconds = default
    return seconds


def _watch_server_waits() -> None:
    """Answers, with an error, every call whose thread has waited for the server longer than the limit: the
    server answers a copy of an existing value at once, so such a wait is for a value that the step waiting
    for this call would compute after it (or for an op queued behind that step). Ending the call ends the
    step with that error; the main thread's wait for the step (settle) then raises it. The callback's thread
    goes on once the step has failed, and the server drops its late reply.

    And asks the server about every other thread's long wait for its context's pending ops while no callback
    of this process runs (_check_stalled_waits)."""
    limit = server_wait_limit()
    check = stalled_wait_check()
    answered: set = set()
    asked: dict = {}
    while not _state["stopping"]:
        time.sleep(_WATCH_INTERVAL_S)
        now = time.monotonic()
        _check_stalled_waits(now, check, asked)
        for call, o in list(_outstanding.items()):
            since = _server_waits.get(o.thread)
            if call in answered or since is None or now - since < limit:
                continue
            answered.add(call)
            message = (f"the Python callback {o.token} of op {o.op} ({o.node}) has waited {now - since:.0f} s "
                       f"for the Salus server, which runs what it asked for (a variable's read, a value the step "
                       f"has not computed yet) after the step that waits for this callback, so neither could "
                       f"finish: pass what the callback reads in as the op's inputs instead "
                       f"(limit: SALUS_CALLBACK_SERVER_WAIT_S={limit:g})")
            _warn(message)
            o.replies.put(_encode_reply(call=call, code=_ABORTED, message=message))
        answered &= set(_outstanding)


def _check_stalled_waits(now: float, check: float, asked: dict) -> None:
    """A wait for the context's pending ops that has lasted `check` seconds with no callback of this process
    running depends on the server alone. The server ends it, with an error naming it, when it has had nothing
    queued or running for the context all that time (then no reply can come: a lost request, a server
    fault); otherwise the wait goes on and is asked about again `check` seconds later."""
    for ident in list(asked):
        if ident not in _settle_waits:
            del asked[ident]
    if _outstanding:
        return
    for ident, (since, handle) in list(_settle_waits.items()):
        if now - since < check or now - asked.get(ident, 0.0) < check:
            continue
        asked[ident] = now
        try:
            from tensorflow.python import pywrap_tfe
            context_id = pywrap_tfe.TFE_GetContextId(handle)
            ended = _end_stalled_wait(context_id, now - since)
        except Exception as e:  # an older server (UNIMPLEMENTED), or none: the wait goes on
            _warn(f"a wait for the Salus server has lasted {now - since:.0f} s; could not ask the server "
                  f"about it ({type(e).__name__}: {e})")
            continue
        if ended:
            _warn(f"a wait for the Salus server's answers had lasted {now - since:.0f} s with nothing queued or "
                  f"running there for it: the server ended it, and the pending ops fail with its reason")


def _end_stalled_wait(context_id: int, waited: float) -> bool:
    """salus.v1.PythonCallbacks/EndStalledWait; whether the server ended the wait."""
    import struct

    import grpc
    from ._proto import _raw_fields
    request = (_varint(1 << 3) + _varint(context_id) + _varint(2 << 3 | 1) + struct.pack("<d", waited)
               + _field(3, b"the ops of this script's eager context that its thread waits for"))
    server = _config.current().server or _config.DEFAULT_SERVER
    with grpc.insecure_channel(server, options=_token.grpc_options()) as channel:
        raw = channel.unary_unary(END_STALLED_WAIT_METHOD)(request, timeout=10)
    return any(number == 1 and value for number, _, value in _raw_fields(raw))


def _run(token: str, inputs: list) -> list:
    """Runs the registered function for `token` as TensorFlow's kernel does; returns serialized TensorProtos."""
    import numpy as np
    from tensorflow.python.framework import constant_op, dtypes, ops, tensor_util
    from tensorflow.python.ops import script_ops
    from tensorflow.core.framework import tensor_pb2
    from tensorflow.python.eager import context

    registry = script_ops._py_funcs
    func = registry.get(token)
    if func is None:
        raise ValueError(f"callback {token} is not registered in this script (it was created before the "
                         f"salus adapter was installed, or garbage-collected)")
    protos = [tensor_pb2.TensorProto.FromString(raw) for raw in inputs]
    # Eager mode, as in TensorFlow's kernel (which makes EagerTensors even for a graph-mode script).
    with context.eager_mode(), ops.device(CLIENT_DEVICE):
        if isinstance(func, script_ops.EagerFunc):
            args = [constant_op.constant(tensor_util.MakeNdarray(p), dtype=dtypes.as_dtype(p.dtype))
                    for p in protos]
        else:
            # Scalars arrive as numpy scalars, as TensorFlow's kernel passes them (PyArray_Return).
            args = [a[()] if a.ndim == 0 else a for a in map(tensor_util.MakeNdarray, protos)]
        result = registry(token, CLIENT_DEVICE, args)
    if result is None:
        values = []
    elif isinstance(result, (list, tuple)):
        values = list(result)
    else:
        values = [result]
    out = []
    for index, value in enumerate(values):
        if isinstance(value, ops.EagerTensor):
            if value.dtype == dtypes.variant:
                # In-process the kernel hands the variant over in memory; it has no form that crosses processes.
                raise _Unconvertible(
                    f"value {index} returned by {token} is a variant tensor (a SparseTensor, RaggedTensor or "
                    f"nested dataset element of a Python generator, as Dataset.from_generator encodes them), "
                    f"which a Python callback of an op that runs on the Salus server cannot pass: yield dense "
                    f"tensors or numpy arrays, or build the structure with tf.data ops after from_generator")
            value = value.numpy()
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        try:
            out.append(tensor_util.make_tensor_proto(array).SerializeToString())
        except Exception as e:
            # What TensorFlow's kernel says of a value it cannot convert (INTERNAL in TF 2.21).
            what = (f"Unsupported numpy type {array.dtype}" if array.dtype.kind == "V"
                    else f"Unsupported object type {type(value).__name__}")
            raise _Unconvertible(f"{what} (value {index} returned by {token}): {e}") from None
    return out


class _Unconvertible(Exception):
    """A callback returned a value that is not a tensor."""


def _code_of(e: BaseException) -> int:
    from tensorflow.python.framework import errors
    if isinstance(e, errors.OpError):
        return e.error_code
    if isinstance(e, _Unconvertible):
        return _INTERNAL
    if isinstance(e, (ValueError, TypeError)):
        return _INVALID_ARGUMENT
    if isinstance(e, StopIteration):
        return _OUT_OF_RANGE
    if isinstance(e, MemoryError):
        return _RESOURCE_EXHAUSTED
    if isinstance(e, NotImplementedError):
        return _UNIMPLEMENTED
    return _UNKNOWN


def _message_of(e: BaseException) -> str:
    """As TensorFlow's kernel words it: the exception, then its traceback (which ends with it again)."""
    if isinstance(e, _Unconvertible):
        return str(e)
    return f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e))


# --- the two messages -------------------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _encode_reply(client: str = "", call: int = 0, outputs=(), code: int = 0, message: str = "") -> bytes:
    """salus.v1.CallbackReply."""
    out = bytearray()
    if client:
        out += _field(1, client.encode())
    if call:
        out += _varint(2 << 3) + _varint(call)
    for proto in outputs:
        out += _field(3, proto)
    if code:
        out += _varint(4 << 3) + _varint(code)
    if message:
        out += _field(5, message.encode("utf-8", errors="replace"))
    return bytes(out)


def _decode_call(raw: bytes):
    """salus.v1.CallbackCall: (call, token, [TensorProto bytes], op, node)."""
    from ._proto import _raw_fields
    call, token, inputs, op, node = 0, "", [], "", ""
    for number, _, value in _raw_fields(raw):
        if number == 1:
            call = value
        elif number == 2:
            token = bytes(value).decode()
        elif number == 3:
            inputs.append(bytes(value))
        elif number == 4:
            op = bytes(value).decode()
        elif number == 5:
            node = bytes(value).decode()
    return call, token, inputs, op, node
