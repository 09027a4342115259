"""Python in the input pipeline: the parts of a TF2 script that call Python run in the script's process.

`Dataset.from_generator`, `tf.py_function` / `tf.numpy_function` in a dataset's `map`, Keras 3's `PyDataset`
and generator inputs all compile to ops (EagerPyFunc, PyFunc) that call back into the Python interpreter that
built them. The server has none, so once the eager context is connected (_eager) these run here:

- **Datasets.** Every tf.data op is wrapped: one whose function calls Python, or whose input dataset is
  already here, is built on this process's CPU (`CLIENT_DEVICE`) instead of the server. An input dataset
  already built on the server is moved here by value (serialized with DatasetToGraphV2, rebuilt with
  DatasetFromGraph). Everything downstream follows, so the whole pipeline and its iterators run here, and
  `for batch in dataset` yields tensors in this process that the next op sends to the server.
- **Eager `tf.py_function` / `tf.numpy_function`** (outside any tf.function) run here too.
- **Keras 3 `fit` / `evaluate`** hand the epoch's iterator to a tf.function that runs on the server, so a
  pipeline here is bridged: the epoch iterator becomes one over a server-side dataset that dequeues from a
  FIFO queue on the server, and right before each train/test call the adapter pulls `steps_per_execution`
  elements from the pipeline here and enqueues them (an end marker when it runs out). The enqueue ops
  precede the call on the same eager stream, so the server never waits for data; the step itself runs on
  the server as one iteration, as with any other input. `predict` takes its batches eagerly: straight from
  the pipeline here, sent with the call. tf-keras (TF_USE_LEGACY_KERAS=1, eager) makes the epoch's iterator
  itself: its train/test functions are wrapped to pass a feed filled from that iterator instead.

Not bridged (see README, "Known limits"): a tf.function of the script's own that takes an iterator of a
pipeline that calls Python (its `next()` would run here, the rest on the server: TensorFlow splits such a
function, which the server refuses with what to do), and a `tf.py_function` inside a tf.function that runs on
the server (refused at registration with PERMISSION_DENIED naming the op).
"""

from __future__ import annotations

import functools
import sys

from ._hook import KERAS_TRAINER_MODULE, TF_KERAS_TRAINING_MODULE

PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
CLIENT_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
# Generated op modules whose functions build or consume datasets.
_DATASET_OP_MODULES = ("tensorflow.python.ops.gen_dataset_ops",
                       "tensorflow.python.ops.gen_experimental_dataset_ops")
_SCRIPT_OP_MODULE = "tensorflow.python.ops.gen_script_ops"
_SCRIPT_OPS = ("eager_py_func", "py_func", "py_func_stateless")

_state = {"installed": False}


class PipelineError(RuntimeError):
    """A pipeline that calls Python could not be moved into the script's process."""


def _connected() -> bool:
    eager = sys.modules.get("salus._eager")
    return eager is not None and eager.mode() == "connected"


# --- which ops run here ------------------------------------------------------------------------------------

def _eager_tensors(values):
    from tensorflow.python.framework import ops
    for value in values:
        if isinstance(value, ops.EagerTensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, ops.EagerTensor))


def _is_here(tensor) -> bool:
    return "/job:localhost/" in (tensor.device or "")


def _is_variant(tensor) -> bool:
    from tensorflow.python.framework import dtypes
    return tensor.dtype == dtypes.variant


def function_calls_python(function) -> bool:
    """Whether a traced function (or one it calls) contains an op that calls Python."""
    graph = getattr(function, "graph", None)
    if graph is None or not hasattr(graph, "as_graph_def"):
        return False
    graph_def = graph.as_graph_def()
    if any(node.op in PYTHON_OPS for node in graph_def.node):
        return True
    return any(node.op in PYTHON_OPS for f in graph_def.library.function for node in f.node_def)


def _functions(values):
    for value in values:
        if hasattr(value, "graph") and hasattr(value, "function_def"):  # ConcreteFunction, AtomicFunction
            yield value


def dataset_here(variant):
    """A dataset variant of the server rebuilt in this process, by value."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import gen_dataset_ops, gen_experimental_dataset_ops
    to_graph, from_graph = (_unwrapped(gen_dataset_ops.dataset_to_graph_v2),
                            _unwrapped(gen_experimental_dataset_ops.dataset_from_graph))
    try:
        with ops.device(variant.device):
            # external_state_policy 0 (WARN): a stateful op upstream (a random seed) is rebuilt as written.
            graph_def = to_graph(variant, external_state_policy=0, strip_device_assignment=True)
        graph_def = graph_def.numpy()  # fetched first (see _call_here)
        with ops.device(CLIENT_DEVICE):
            return from_graph(graph_def)
    except Exception as e:
        raise PipelineError(
            f"salus: this tf.data pipeline calls Python, so it runs in the script's process, but the part of "
            f"it built before the Python could not be moved there ({type(e).__name__}: {e}). Build the "
            f"pipeline's source in the same statement, or start it from Dataset.from_generator") from e


def tensor_here(tensor, op_name: str):
    """A tensor input of a dataset op built here (a batch size, a captured constant), copied here."""
    from tensorflow.python.framework import dtypes
    if tensor.dtype == dtypes.resource:
        raise PipelineError(
            f"salus: this tf.data pipeline calls Python, so it runs in the script's process, but its "
            f"{op_name} uses state that lives on the server (a tf.Variable, table or other resource). "
            f"Create that state inside the pipeline's functions, or pass its value as a tensor")
    return tensor._copy_to_device(CLIENT_DEVICE)


def _unwrapped(op):
    """TensorFlow's own op function behind one of this module's wrappers."""
    return getattr(op, "_salus_original", op)


def _call_here(op, args, kwargs, move):
    """Runs `op` on this process's CPU, its tensor inputs on the server first made local by `move`: an op
    here with an input on the server would be split between the two, which the server refuses."""
    from tensorflow.python.framework import ops

    def here(value):
        if isinstance(value, (list, tuple)):
            return type(value)(here(v) for v in value)
        if isinstance(value, ops.EagerTensor) and not _is_here(value):
            return move(value)
        return value

    args = tuple(here(a) for a in args)
    kwargs = {k: here(v) for k, v in kwargs.items()}
    with ops.device(CLIENT_DEVICE):
        return op(*args, **kwargs)


def _wrap_dataset_op(name: str, op):
    @functools.wraps(op)
    def wrapper(*args, **kwargs):
        if not _connected():
            return op(*args, **kwargs)
        from tensorflow.python.eager import context
        if not context.executing_eagerly():
            return op(*args, **kwargs)
        values = (*args, *kwargs.values())
        variants = [t for t in _eager_tensors(values) if _is_variant(t)]
        here = any(_is_here(t) for t in variants) or any(function_calls_python(f) for f in _functions(values))
        if not here:
            return op(*args, **kwargs)
        _patch_keras_if_loaded()
        return _call_here(op, args, kwargs,
                          lambda t: dataset_here(t) if _is_variant(t) else tensor_here(t, name))

    wrapper._salus_original = op
    return wrapper


def _wrap_script_op(op):
    @functools.wraps(op)
    def wrapper(*args, **kwargs):
        if _connected():
            from tensorflow.python.eager import context
            if context.executing_eagerly():
                return _call_here(op, args, kwargs, lambda t: t._copy_to_device(CLIENT_DEVICE))
        return op(*args, **kwargs)

    wrapper._salus_original = op
    return wrapper


def _is_op_function(name: str, value) -> bool:
    return (callable(value) and not name.startswith("_") and "eager_fallback" not in name
            and getattr(value, "__module__", "").startswith("tensorflow.python.ops.gen_"))


def install() -> None:
    """Wraps TensorFlow's generated dataset and Python-callback op functions (idempotent)."""
    if _state["installed"]:
        return
    import importlib
    for module_name in _DATASET_OP_MODULES:
        module = importlib.import_module(module_name)
        for name, value in list(vars(module).items()):
            if not _is_op_function(name, value) or hasattr(value, "_salus_original"):
                continue
            # Iterator ops take the iterator's resource and run where it lives already.
            if name.startswith(("iterator", "anonymous_iterator", "multi_device_iterator")):
                continue
            setattr(module, name, _wrap_dataset_op(name, value))
    script = importlib.import_module(_SCRIPT_OP_MODULE)
    for name in _SCRIPT_OPS:
        value = getattr(script, name, None)
        if value is not None and not hasattr(value, "_salus_original"):
            setattr(script, name, _wrap_script_op(value))
    _state["installed"] = True
    _patch_keras_if_loaded()


# --- Keras 3: feeding the server's step from a pipeline here ---------------------------------------------

def is_dataset_here(dataset) -> bool:
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.framework import ops
    if not isinstance(dataset, dataset_ops.DatasetV2):
        return False
    try:
        variant = dataset._variant_tensor
    except Exception:
        return False
    return isinstance(variant, ops.EagerTensor) and _is_here(variant)


class Feed:
    """A server-side iterator whose elements this process enqueues from a pipeline that runs here."""

    def __init__(self, dataset, server_device: str, source=None):
        """`source`: an iterator of `dataset` already made here (tf-keras makes its own), else a new one."""
        import tensorflow as tf
        from tensorflow.python.data.util import structure

        self._spec = dataset.element_spec if dataset is not None else source.element_spec
        self._flat = structure.get_flat_tensor_specs(self._spec)
        if any(s.dtype in (tf.variant, tf.resource) for s in self._flat):
            raise PipelineError("salus: only datasets of dense tensors can feed a step on the server")
        self._ended = False
        self._source = source if source is not None else iter(dataset)
        spec, flat = self._spec, self._flat
        with tf.device(server_device):
            queue = tf.queue.FIFOQueue(-1, [tf.bool] + [s.dtype for s in flat])
            self._queue = queue
            self._true = tf.constant(True)
            self._end = [tf.constant(False)] + [
                tf.zeros([d if d is not None else 0 for d in s.shape.as_list()] if s.shape.rank is not None
                         else [0], s.dtype) for s in flat]

            def dequeue(_):
                values = queue.dequeue()
                return values[0], tuple(values[1:])

            def element(_, components):
                components = list(components)
                for c, s in zip(components, flat):
                    c.set_shape(s.shape)
                return structure.from_compatible_tensor_list(spec, components)

            # No read-ahead on the server: a dequeue runs only inside the step's get_next, after the
            # elements were enqueued. A prefetch thread would wait on the queue past the end marker, and
            # TensorFlow crashes when a queue is destroyed under a waiting dequeue (the feed of an
            # abandoned epoch is dropped without closing its queue: a close from __del__ could land in
            # whatever function is being traced at that moment).
            options = tf.data.Options()
            options.autotune.enabled = False
            options.experimental_optimization.inject_prefetch = False
            options.experimental_optimization.map_parallelization = False
            self.served = (tf.data.Dataset.from_tensors(0).repeat().map(dequeue)
                           .take_while(lambda flag, _: flag).map(element).with_options(options))

    def iterator(self):
        """A server-side iterator over this feed (it holds the feed; the feed does not hold it)."""
        return FeedIterator(self.served, self)

    def next_here(self):
        if self._source is None:
            raise StopIteration
        try:
            return next(self._source)
        except StopIteration:
            self._source = None
            raise

    def push(self, count: int) -> None:
        """Enqueues the pipeline's next `count` elements (or what is left and the end marker)."""
        from tensorflow.python.data.util import structure
        for _ in range(max(1, int(count))):
            if self._ended:
                return
            try:
                element = next(self._source)
            except StopIteration:
                # Released at once, not by a later garbage collection: the iterator's threads may need
                # the interpreter lock to stop, and a collection at exit holds it.
                self._ended, self._source = True, None
                self._queue.enqueue(self._end)
                return
            self._queue.enqueue([self._true] + structure.to_tensor_list(self._spec, element))


def _iterator_class():
    from tensorflow.python.data.ops import iterator_ops

    class _FeedIterator(iterator_ops.OwnedIterator):
        """The iterator Keras's step function takes; `_salus_feed` fills it."""

        def __init__(self, dataset, feed):
            super().__init__(dataset)
            self._salus_feed = feed

        def __next__(self):
            # Taken eagerly (Keras's predict does): straight from the pipeline here, not via the server.
            return self._salus_feed.next_here()

    return _FeedIterator


def FeedIterator(dataset, feed):  # noqa: N802  (the class needs TensorFlow, made on first use)
    cls = _state.get("feed_iterator")
    if cls is None:
        cls = _state["feed_iterator"] = _iterator_class()
    return cls(dataset, feed)


class _FeedSource:
    """What a patched TFEpochIterator iterates for a pipeline here: each iter() is a new feed (an epoch)."""

    def __init__(self, dataset, server_device: str):
        self._dataset = dataset
        self._device = server_device

    def __iter__(self):
        # The iterator holds the feed, not the other way round: no cycle, so an abandoned epoch's
        # pipeline is released when Keras drops the iterator, not by a garbage collection at exit.
        return Feed(self._dataset, self._device).iterator()


def _typed_errors_and_fed(function, feed_for, steps_per_call):
    """A Keras step function that first fills its feed (`feed_for(iterator)`: the feed iterator to pass
    instead, or None) with `steps_per_call()` elements, and whose remote errors keep their type."""

    @functools.wraps(function)
    def fed_step(iterator, *args, **kwargs):
        fed = feed_for(iterator) if _connected() else None
        if fed is not None:
            fed._salus_feed.push(steps_per_call())
            iterator = fed
        try:
            return function(iterator, *args, **kwargs)
        except ValueError:
            # TensorFlow's remote-eager client does not wait for a function call; an error of the step
            # (OutOfRange at the end of a dataset of unknown length) poisons its outputs, and reading
            # one's device raises a ValueError. A sync raises it with its type, as in-process.
            if _connected():
                from tensorflow.python.eager import context
                context.context().sync_executors()
            raise

    fed_step._salus_fed = True
    return fed_step


def patch_keras_trainer(module) -> None:
    """Keras 3's TensorFlow trainer: its epoch iterator over a pipeline here becomes a feed, filled right
    before each train/test step takes from it; a step's error reaches the script with its type."""
    epoch_iterator = getattr(module, "TFEpochIterator", None)
    trainer = getattr(module, "TensorFlowTrainer", None)
    if epoch_iterator is None or trainer is None or getattr(trainer, "_salus_patched", False):
        return
    original_get = epoch_iterator._get_iterator
    original_make = trainer._make_function

    def _get_iterator(self):
        source = original_get(self)
        if _connected() and is_dataset_here(source):
            from . import _eager
            return _FeedSource(source, _eager.SERVER_DEVICE)
        return source

    def _make_function(self, step_function):
        return _typed_errors_and_fed(
            original_make(self, step_function),
            lambda iterator: iterator if getattr(iterator, "_salus_feed", None) is not None else None,
            lambda: getattr(self, "steps_per_execution", 1) or 1)

    epoch_iterator._get_iterator = _get_iterator
    trainer._make_function = _make_function
    trainer._salus_patched = True


def patch_tf_keras_training(module) -> None:
    """tf-keras (TF_USE_LEGACY_KERAS=1) in eager mode: its train/test functions take the epoch's iterator,
    made by its DataHandler; over a pipeline here, each call gets a feed iterator filled from it."""
    import weakref
    model_cls = getattr(module, "Model", None)
    if model_cls is None or getattr(model_cls, "_salus_patched", False):
        return
    feeds: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> (local iterator id, feed it)

    def feed_for(model):
        def lookup(iterator):
            from tensorflow.python.data.ops import iterator_ops
            if not isinstance(iterator, iterator_ops.OwnedIterator):
                return None
            if not _is_here(iterator._iterator_resource):
                return None
            held = feeds.get(model)
            if held is None or held[0] != id(iterator):
                from . import _eager
                held = feeds[model] = (id(iterator), Feed(None, _eager.SERVER_DEVICE, source=iterator).iterator())
            return held[1]
        return lookup

    def steps_of(model):
        def read():
            spe = getattr(model, "_steps_per_execution", None)
            return int(spe.numpy()) if spe is not None else 1
        return read

    for name in ("make_train_function", "make_test_function"):
        def make(self, force=False, _original=getattr(model_cls, name), _attr=name.removeprefix("make_")):
            function = _original(self, force=force)
            if function is None or getattr(function, "_salus_fed", False) or not _connected():
                return function
            wrapped = _typed_errors_and_fed(function, feed_for(self), steps_of(self))
            setattr(self, _attr, wrapped)  # what the original set: train_function / test_function
            return wrapped

        setattr(model_cls, name, make)
    model_cls._salus_patched = True


def patch_keras_module(module) -> None:
    """Keras 3's trainer or tf-keras's training module, by name (the import hook and the dataset wrappers)."""
    if module.__name__ == TF_KERAS_TRAINING_MODULE:
        patch_tf_keras_training(module)
    else:
        patch_keras_trainer(module)


def _patch_keras_if_loaded() -> None:
    for name in (KERAS_TRAINER_MODULE, TF_KERAS_TRAINING_MODULE):
        module = sys.modules.get(name)
        if module is not None:
            patch_keras_module(module)
