"""tf-keras (legacy Keras) in TF1 graph mode: fit / evaluate / predict, then grow the graph and use it again.

Eager execution is disabled process-wide and Keras's backend session is global, so this runs in its own
process and runs the same script once per target, one after the other, resetting Keras between runs
(clear_session also resets layer-name counters, so both runs build identical graphs).

Through a server tf-keras sends CreateSession, ExtendSession (several, as the graph grows), RunStep
(VarIsInitialized checks, initialisers) and MakeCallable / RunCallable per fit/evaluate/predict function.

CLI: python keras_graph.py --targets "" grpc://127.0.0.1:PORT ...  -> one JSON line {target: results}
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # must precede the TensorFlow import

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
keras = tf.compat.v1.keras  # tf-keras (legacy Keras) because of TF_USE_LEGACY_KERAS=1


def data():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(192, 10)).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int64) + (x[:, 3] > 1).astype(np.int64)  # 3 classes
    return x[:160], y[:160], x[160:], y[160:]


def to_list(a) -> list:
    return np.asarray(a, dtype=np.float64).tolist()


def run(target: str, isolate: bool) -> dict:
    keras.backend.clear_session()          # new default graph, fresh layer-name counters
    tf.compat.v1.set_random_seed(42)       # graph seed on that new graph
    config = tf.compat.v1.ConfigProto(isolate_session_state=True) if isolate else None
    sess = tf.compat.v1.Session(target, config=config)
    keras.backend.set_session(sess)
    x, y, xt, yt = data()
    glorot = keras.initializers.glorot_uniform

    model = keras.Sequential([
        keras.layers.Dense(32, activation="relu", input_shape=(10,), kernel_initializer=glorot(seed=1)),
        keras.layers.BatchNormalization(),
        keras.layers.Dropout(0.3, seed=2),
        keras.layers.Dense(3, activation="softmax", kernel_initializer=glorot(seed=3)),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    ev = model.evaluate(xt, yt, batch_size=16, verbose=0)
    pred = model.predict(xt, batch_size=16, verbose=0)

    # Grow the graph after use: a second model on top of the first one's hidden features, with new
    # layers and a new optimizer (more ExtendSession, new callables), trained and used again.
    features = keras.Model(model.inputs, model.layers[1].output)
    head = keras.layers.Dense(2, kernel_initializer=glorot(seed=4))(features.output)
    model2 = keras.Model(features.inputs, head)
    model2.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    y2 = np.stack([x[:, 0] * 0.5, x[:, 1] - x[:, 2]], axis=1).astype(np.float32)
    hist2 = model2.fit(x, y2, batch_size=32, epochs=2, shuffle=False, verbose=0)
    pred2 = model2.predict(xt, batch_size=64, verbose=0)
    # The first model shares the trained layers, so its predictions changed; predict with it again.
    pred_again = model.predict(xt[:8], verbose=0)

    sess.close()
    return {
        "loss": to_list(hist.history["loss"]),
        "accuracy": to_list(hist.history["accuracy"]),
        "evaluate": to_list(ev),
        "predict": to_list(pred),
        "loss2": to_list(hist2.history["loss"]),
        "predict2": to_list(pred2),
        "predict_again": to_list(pred_again),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", nargs="+", required=True, help='"" is in-process')
    ap.add_argument("--isolate-session-state", action="store_true")
    args = ap.parse_args()
    results = {t: run(t, args.isolate_session_state) for t in args.targets}
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
