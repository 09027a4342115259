"""An unmodified Keras 3 model trained with fit, for the device-memory tests (test_allocator_memory.py).

argv: MODE MODEL (MODEL: "dense", an MLP, or "cnn", two convolutions)
  fit        train STEPS batches with model.fit (through the server when SALUS_SERVER is set), print HOLD and wait
             for a line on stdin (the job stays open for the test to read the server's figures), then print
             {"losses": [...]}
  reference  in-process: TensorFlow's own accounting of each of fit's first STEPS step calls, as get_memory_info
             reads it: the CPU allocator's peak above its use at the call's start (run with
             TF_CPU_ALLOCATOR_USE_BFC=true: TensorFlow's default CPU allocator keeps no statistics); prints
             {"rises": [call 1's, call 2's, ...]}
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

BATCH, STEPS = 64, 12
mode, kind = sys.argv[1], sys.argv[2]
keras.utils.set_random_seed(5)
rng = np.random.RandomState(0)
if kind == "cnn":
    x = rng.normal(size=(BATCH * STEPS, 28, 28, 1)).astype(np.float32)
    layers = [keras.Input((28, 28, 1)),
              keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
              keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
              keras.layers.Flatten(), keras.layers.Dense(10)]
else:
    x = rng.normal(size=(BATCH * STEPS, 784)).astype(np.float32)
    layers = [keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
y = rng.randint(0, 10, size=(BATCH * STEPS,)).astype(np.int64)
model = keras.Sequential(layers)
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

# A tf.data pipeline without prefetching: each batch is made inside the step call (fit's adapter takes a Dataset as
# it is), so no background thread allocates beside the step and TensorFlow's own figure repeats from run to run.
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
if mode == "reference":
    # fit's own step function, on the same data.
    iterator = iter(dataset)
    model.make_train_function()
    rises = []
    for _ in range(STEPS):
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        model.train_function(iterator)
        rises.append(int(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before))
    print(json.dumps({"rises": rises}), flush=True)
else:
    history = model.fit(dataset, epochs=1, verbose=0)
    print("HOLD", flush=True)
    sys.stdin.readline()
    print(json.dumps({"losses": history.history["loss"]}), flush=True)
