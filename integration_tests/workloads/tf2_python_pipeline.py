"""An unmodified TF2 / Keras 3 script whose input pipeline calls Python: Keras fit (with validation data),
evaluate and predict on Dataset.from_generator (length unknown, steps_per_execution 1 and 3), on a PyDataset (in this thread, and with
worker threads), on a keras.utils.Sequence subclass and on a plain Python generator; tf.py_function and
tf.numpy_function inside a dataset's map (Keras fit, and a custom loop over the batches); the dataset iterated
eagerly; an eager tf.py_function; a generator that raises. Every callback counts its calls in this process.

prints one JSON line: each case's numbers (losses, weights, predictions, batches), the number of Python
callback calls it made here, and the device of the model's weights.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.RandomState(0)
X = rng.normal(size=(96, 6)).astype(np.float32)
Y = (X[:, :1] * 0.5 - X[:, 1:2] + 0.1 * rng.normal(size=(96, 1))).astype(np.float32)
BATCH = 16
SPEC = (tf.TensorSpec((None, 6), tf.float32), tf.TensorSpec((None, 1), tf.float32))
calls = {}


def count(case):
    calls[case] = calls.get(case, 0) + 1


def model_for(case):
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"],
                  steps_per_execution=3 if case.endswith("spe3") else 1)
    return model


def generator(case, n=96):
    def gen():
        for i in range(0, n, BATCH):
            count(case)
            yield X[i:i + BATCH], Y[i:i + BATCH]
    return gen


def numbers(model, history):
    return {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "weights": [float(w.numpy().sum()) for w in model.weights]}


def weight_device(model):
    v = getattr(model.weights[0], "value", model.weights[0])
    return v.device


out = {}
devices = set()


def fit_case(case, data, **kwargs):
    model = model_for(case)
    history = model.fit(data, epochs=2, verbose=0, shuffle=False, **kwargs)
    out[case] = numbers(model, history)
    devices.add(weight_device(model))
    return model


# Dataset.from_generator: length unknown, so each epoch ends with OutOfRange from the step.
for case in ("from_generator", "from_generator_spe3"):
    ds = tf.data.Dataset.from_generator(generator(case), output_signature=SPEC)
    validation = tf.data.Dataset.from_generator(generator(case, n=32), output_signature=SPEC)
    model = fit_case(case, ds, validation_data=validation)
    out[case]["evaluate"] = [float(v) for v in model.evaluate(ds, verbose=0)]
    out[case]["predict"] = [float(v) for v in model.predict(ds, verbose=0).ravel()[:12]]


class Batches(keras.utils.PyDataset):
    def __init__(self, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def __len__(self):
        return len(X) // BATCH

    def __getitem__(self, i):
        count(self.case)
        return X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH]


fit_case("pydataset", Batches("pydataset"))
fit_case("pydataset_workers", Batches("pydataset_workers", workers=2))


class Sequence(keras.utils.Sequence):
    def __len__(self):
        return len(X) // BATCH

    def __getitem__(self, i):
        count("sequence")
        return X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH]


fit_case("sequence", Sequence())


def endless():
    while True:
        for i in range(0, len(X), BATCH):
            count("python_generator")
            yield X[i:i + BATCH], Y[i:i + BATCH]


fit_case("python_generator", endless(), steps_per_epoch=len(X) // BATCH)


def scale(x):
    count("py_function_map")
    return x * 0.5


def shift(x):
    count("numpy_function_map")
    return (x + np.float32(0.25)).astype(np.float32)


mapped = (tf.data.Dataset.from_tensor_slices((X, Y))
          .map(lambda x, y: (tf.py_function(scale, [x], tf.float32), y))
          .map(lambda x, y: (tf.numpy_function(shift, [x], tf.float32), y))
          .map(lambda x, y: (tf.ensure_shape(x, (6,)), y))
          .batch(BATCH))
fit_case("py_function_map", mapped)
out["eager_iteration"] = [float(x.numpy().sum()) for x, _ in mapped]

# A custom loop: batches from the pipeline here, the step (a tf.function) on the server.
keras.utils.set_random_seed(11)
w = tf.Variable(tf.random.normal((6, 1), seed=1))
opt = keras.optimizers.SGD(0.05)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    opt.apply_gradients([(tape.gradient(loss, w), w)])
    return loss


out["custom_loop"] = [float(train_step(x, y)) for _ in range(2) for x, y in mapped]
devices.add(w.device)

# An eager tf.py_function, outside any tf.function.
out["eager_py_function"] = tf.py_function(lambda a: a * 3.0, [tf.constant([1.0, 2.0])], tf.float32).numpy().tolist()


def failing():
    yield X[:BATCH], Y[:BATCH]
    raise RuntimeError("the generator failed here")


try:
    fit_case("failing_generator", tf.data.Dataset.from_generator(failing, output_signature=SPEC))
    out["failing_generator"] = "no error"
except Exception as e:
    out["failing_generator"] = [type(e).__name__, "the generator failed here" in str(e)]

out["calls"] = calls
out["devices"] = sorted(devices)
print(json.dumps(out), flush=True)
sys.stderr.flush()
# Keras's generator and PyDataset adapters read ahead with a prefetch that this script leaves mid-stream
# (steps_per_epoch, a known length). Such an iterator freed by the interpreter's last garbage collection waits
# for its prefetch thread, which waits for the interpreter lock: the process hangs at exit, in-process too
# (measured: 1 run in about 12 with SALUS_SERVER unset). Nothing is left to do here, so skip that collection.
os._exit(0)
