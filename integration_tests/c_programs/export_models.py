"""Writes what the C programs of test_c_api_shim.py load, into OUT_DIR (one TensorFlow import for all):

  train_graph.pb      GraphDef of a small regression (ops init, train; tensor loss:0), data as constants
  config_*.pb         serialized ConfigProtos for train's TF_SetConfig
  model_v1/           SavedModel from the TF1 builder (ref variables, a main op), tag "serve"
  model_v2/           tf.saved_model.save of a tf.Module (resource variables), tag "serve"
  model_assets/       a tf.Module with a vocabulary file (an asset), tag "serve"

Prints one JSON line: the SavedModels' input/output tensor names, the Python-computed outputs and model_v2's
saver tensors.

  python export_models.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, saved_model_pb2

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(7)
probe = np.array([[0.5, -1.25, 2.0]], np.float32)
result = {}

# Training graph: y = x.w + b, mean squared error, plain gradient descent.
with tf.Graph().as_default() as g:
    x_data = rng.normal(size=(64, 3)).astype(np.float32)
    y_data = (x_data[:, :1] * 2.0 - x_data[:, 2:] * 0.5 + rng.normal(size=(64, 1)) * 0.1).astype(np.float32)
    x, y_true = tf.constant(x_data), tf.constant(y_data)
    w = tf.compat.v1.get_variable("w", initializer=rng.normal(size=(3, 1)).astype(np.float32))
    b = tf.compat.v1.get_variable("b", initializer=np.zeros((1,), np.float32))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y_true), name="loss")
    tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train")
    tf.group(*[v.initializer for v in tf.compat.v1.global_variables()], name="init")
    (out / "train_graph.pb").write_bytes(g.as_graph_def().SerializeToString())

own = config_pb2.ConfigProto(intra_op_parallelism_threads=2)
own.experimental.session_metadata.name = "c-own-name"
(out / "config_own_name.pb").write_bytes(own.SerializeToString())
(out / "config_threads.pb").write_bytes(config_pb2.ConfigProto(inter_op_parallelism_threads=2).SerializeToString())

# TF1 SavedModel: ref variables (VariableV2), restored by the Saver; a main op that must run.
w1 = rng.normal(size=(3, 2)).astype(np.float32)
with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
    x = tf.compat.v1.placeholder(tf.float32, (None, 3), name="x")
    w = tf.compat.v1.Variable(w1, name="w", use_resource=False)
    b = tf.compat.v1.Variable(np.array([0.25, -0.5], np.float32), name="b", use_resource=False)
    y = tf.nn.tanh(tf.matmul(x, w) + b, name="y")
    sess.run(tf.compat.v1.global_variables_initializer())
    builder = tf.compat.v1.saved_model.Builder(str(out / "model_v1"))
    signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
    builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature},
                                         main_op=tf.no_op(name="main_op"))
    builder.save()
    result["v1"] = {"input": x.name, "output": y.name, "expected": sess.run(y, {x: probe}).tolist()}


# TF2 SavedModel of a tf.Module: resource variables (VarHandleOp), a tf.function signature.
class Dense(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(rng.normal(size=(3, 4)).astype(np.float32), name="w")
        self.b = tf.Variable(rng.normal(size=(4,)).astype(np.float32), name="b")

    @tf.function(input_signature=[tf.TensorSpec((None, 3), tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w) + self.b)}


module = Dense()
tf.saved_model.save(module, str(out / "model_v2"), signatures=module.__call__)
saved = saved_model_pb2.SavedModel.FromString((out / "model_v2" / "saved_model.pb").read_bytes())
sig = saved.meta_graphs[0].signature_def["serving_default"]
saver = saved.meta_graphs[0].saver_def
result["v2"] = {"input": sig.inputs["x"].name, "output": sig.outputs["y"].name,
                "expected": module(tf.constant(probe))["y"].numpy().tolist(),
                "saver": {"filename": saver.filename_tensor_name, "save": saver.save_tensor_name}}


# A model with an asset file: a lookup table initialized from a vocabulary at load time.
class Vocab(tf.Module):
    def __init__(self, path):
        super().__init__()
        init = tf.lookup.TextFileInitializer(path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                             tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
        self.table = tf.lookup.StaticHashTable(init, default_value=-1)

    @tf.function(input_signature=[tf.TensorSpec((None, 3), tf.float32, name="x")])
    def __call__(self, x):
        return {"y": x * tf.cast(self.table.lookup(tf.constant("b")), tf.float32)}


vocab = out / "vocab.txt"
vocab.write_text("a\nb\nc\n")
tf.saved_model.save(Vocab(str(vocab)), str(out / "model_assets"))
result["probe"] = probe[0].tolist()
print(json.dumps(result))
