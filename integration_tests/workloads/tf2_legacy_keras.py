"""An unmodified tf-keras (legacy Keras 2, TF_USE_LEGACY_KERAS=1) script in eager mode (eager execution left
enabled): fit, evaluate, predict. No salus import.

prints one JSON line: {"history": {...}, "evaluate": [...], "predict": [...], "devices": [...]}
"""

import json
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

assert tf.executing_eagerly()
tf.keras.utils.set_random_seed(5)
rng = np.random.RandomState(2)
x = rng.normal(size=(160, 6)).astype(np.float32)
y = (rng.rand(160) > 0.5).astype(np.int64)

model = tf.keras.Sequential([
    tf.keras.layers.Dense(16, activation="relu", input_shape=(6,)),
    tf.keras.layers.Dropout(0.2, seed=1),
    tf.keras.layers.Dense(2),
])
model.compile(optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
hist = model.fit(x, y, batch_size=32, epochs=3, validation_split=0.25, verbose=0)
evaluate = model.evaluate(x, y, batch_size=40, verbose=0)
predict = model.predict(x[:6], verbose=0)

print(json.dumps({
    "keras": tf.keras.__version__ if hasattr(tf.keras, "__version__") else "",
    "history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
    "evaluate": [float(v) for v in evaluate],
    "predict": [float(v) for v in predict.ravel()],
    "devices": sorted({v.device for v in model.weights}),
}))
