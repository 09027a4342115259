"""An unmodified Keras 3 script (TF2 eager, no salus import): fit with validation data, evaluate, predict, on a
model with BatchNormalization and Dropout. Run with SALUS_SERVER set its eager work goes to the server.

prints one JSON line: {"history": {...per epoch...}, "evaluate": [...], "predict": [...], "devices": [...]}
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras.utils.set_random_seed(7)
rng = np.random.RandomState(0)
x = rng.normal(size=(256, 8)).astype(np.float32)
y = (x[:, :1] * 0.7 - x[:, 1:2] + 0.1 * rng.normal(size=(256, 1))).astype(np.float32)
x_val, y_val = x[:64] + 0.05, y[:64]

model = keras.Sequential([
    keras.Input((8,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.BatchNormalization(),
    keras.layers.Dropout(0.25, seed=3),
    keras.layers.Dense(16, activation="tanh"),
    keras.layers.Dense(1),
])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"], steps_per_execution=1)
hist = model.fit(x, y, batch_size=32, epochs=3, validation_data=(x_val, y_val), shuffle=True, verbose=0)
evaluate = model.evaluate(x_val, y_val, batch_size=32, verbose=0)
predict = model.predict(x[:8], batch_size=8, verbose=0)


def device_of(w):
    v = getattr(w, "value", w)
    return getattr(v, "device", "") or getattr(getattr(w, "handle", None), "device", "")


print(json.dumps({
    "keras": keras.__version__, "tf": tf.__version__,
    "history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
    "evaluate": [float(v) for v in evaluate],
    "predict": [float(v) for v in predict.ravel()],
    "devices": sorted({device_of(w) for w in model.weights + model.optimizer.variables}),
}))
