"""Keras 3 fit on a Python generator that yields tensors living where the script computes (on the server
when run through it), the shape of Keras's own layer-test harness (keras/src/testing/test_case.py,
run_training_step): a subclassed model, a custom loss, jit_compile="auto", steps_per_epoch=1; then fit,
evaluate and predict on a PyDataset of such tensors, and an eager get_next_as_optional loop over a generator's
dataset. Prints the numbers of each as one JSON line.

Through the server the generator runs in the script's callback thread while the step that asked for its
element waits; reading the yielded tensors there, or computing on them, must not queue behind that step
(issue 42). A generator of SparseTensors fails there with the adapter's error (recorded, not raised): from_generator
hands them over as variant tensors, which no callback can send to the server."""

import json

import numpy as np
import tensorflow as tf
import keras


class Model(keras.Model):
    def __init__(self, units):
        super().__init__()
        self.layer = keras.layers.Dense(units, kernel_initializer="ones")

    def call(self, x, training=False):
        return self.layer(x, training=training)


class SumLoss(keras.losses.Loss):
    def __call__(self, y_true, y_pred, sample_weight=None):
        return keras.ops.sum(y_pred)


def fit_once(x, y, jit_compile, steps_per_execution=1, in_generator=lambda x: x):
    model = Model(y.shape[-1])
    model.compile(optimizer="sgd", loss=SumLoss(), jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)

    def data():
        while True:
            yield in_generator(x), y

    model.fit(data(), steps_per_epoch=steps_per_execution, verbose=0)
    return [w.tolist() for w in model.get_weights()]


class Batches(keras.utils.PyDataset):
    """Yields the script's tensors (on the server through it), two batches of one row each."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return self.x[i:i + 1], self.y[i:i + 1]


def pydataset_entry_points(x, y):
    """fit (steps_per_execution 2), evaluate and predict on a PyDataset."""
    model = Model(y.shape[-1])
    model.compile(optimizer="sgd", loss="mse", jit_compile="auto", steps_per_execution=2)
    model.fit(Batches(x, y), epochs=2, verbose=0, shuffle=False)
    return {"weights": [w.tolist() for w in model.get_weights()],
            "evaluate": float(model.evaluate(Batches(x, y), verbose=0)),
            "predict": model.predict(Batches(x, y), verbose=0).tolist()}


def optional_loop(x):
    """An eager loop on get_next_as_optional over a generator's dataset, to its end."""
    ds = tf.data.Dataset.from_generator(lambda: (x * float(i) for i in range(3)),
                                        output_signature=tf.TensorSpec(x.shape, tf.float32))
    iterator, sums = iter(ds), []
    while True:
        element = iterator.get_next_as_optional()
        if not element.has_value():
            return sums
        sums.append(float(tf.reduce_sum(element.get_value())))


def fit_or_error(x, y):
    try:
        return fit_once(x, y, "auto")
    except tf.errors.OpError as e:
        return {"error": e.message[-2000:]}


rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((2, 3)).astype("float32"))  # an eager tensor: on the server through it
y = tf.constant(rng.standard_normal((2, 4)).astype("float32"))
results = {
    "harness": fit_once(x, y, "auto"),
    "no_jit": fit_once(x, y, False),
    "steps_per_execution_3": fit_once(x, y, "auto", steps_per_execution=3),
    "numpy": fit_once(x.numpy(), y.numpy(), "auto"),
    # Ops in the generator mixing a server tensor with one made there (under the callback's CPU scope).
    "computed_in_generator": fit_once(x, y, "auto", in_generator=lambda x: x * tf.constant(2.0) + 1.0),
    "sparse": fit_or_error(tf.sparse.from_dense(x), y),
    "pydataset": pydataset_entry_points(x, y),
    "optional_loop": optional_loop(x),
    "devices": sorted({v.device for v in [x, y]}),
}
print(json.dumps(results))
