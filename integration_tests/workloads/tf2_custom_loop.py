"""An unmodified TF2 custom training loop: tf.function + GradientTape over a tf.data pipeline built from numpy
(from_tensor_slices, shuffle with a seed, map, batch). No salus import.

prints one JSON line: {"losses": [...per step...], "epoch_means": [...], "weights": [...], "devices": [...]}
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.random.set_seed(11)
rng = np.random.RandomState(1)
features = rng.normal(size=(200, 4)).astype(np.float32)
labels = (features @ np.array([[1.5], [-2.0], [0.5], [0.0]], np.float32) + 0.3).astype(np.float32)

ds = (tf.data.Dataset.from_tensor_slices((features, labels))
      .shuffle(200, seed=5, reshuffle_each_iteration=True)
      .map(lambda a, b: (a * 2.0 - 1.0, b), num_parallel_calls=1, deterministic=True)
      .batch(25))

w = tf.Variable(tf.random.normal([4, 1], seed=1), name="w")
b = tf.Variable(tf.zeros([1]), name="b")
opt_slots = [tf.Variable(tf.zeros_like(w)), tf.Variable(tf.zeros_like(b))]


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) + b - yb))
    gw, gb = tape.gradient(loss, [w, b])
    for slot, g, var in zip(opt_slots, (gw, gb), (w, b)):  # momentum SGD by hand
        slot.assign(0.9 * slot + g)
        var.assign_sub(0.05 * slot)
    return loss


losses, epoch_means = [], []
for epoch in range(3):
    total = tf.constant(0.0)
    n = 0
    for xb, yb in ds:
        loss = train_step(xb, yb)
        total += loss
        n += 1
        losses.append(float(loss))
    epoch_means.append(float(total / n))

print(json.dumps({
    "losses": losses, "epoch_means": epoch_means,
    "weights": [float(v) for v in tf.concat([tf.reshape(w, [-1]), b], 0).numpy()],
    "devices": sorted({w.device, b.device, *(s.device for s in opt_slots), total.device}),
}))
