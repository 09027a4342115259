"""Uses salus-tf's explicit API: salus.session(...) and salus.configure(...) (SALUS_SERVER not needed).

CLI: python explicit_api.py HOST:PORT [SUFFIX]
Jobs "explicit-SUFFIX" and "configured-SUFFIX": prints "HOLD" with both sessions open, waits for a line on
stdin, then prints one JSON line {"explicit": x, "configured": x, "local": x}.
"""

import json
import sys

import tensorflow as tf

import salus

server = sys.argv[1]
suffix = sys.argv[2] if len(sys.argv) > 2 else "0"
g = tf.Graph()
with g.as_default():
    a = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    out = tf.reduce_sum(tf.matmul(a, a))

local = tf.compat.v1.Session(graph=g).run(out)  # before configure(): in-process

config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
s1 = salus.session(graph=g, config=config, server=server, name=f"explicit-{suffix}", priority=5, iterations=10)
explicit = s1.run(out)
assert config.experimental.session_metadata.name == "", "the caller's config was modified"

salus.configure(server=server, name=f"configured-{suffix}", seconds=3)
s2 = tf.compat.v1.Session(graph=g)
configured = s2.run(out)

print("HOLD", flush=True)
sys.stdin.readline()
s1.close()
s2.close()
print(json.dumps({"explicit": float(explicit), "configured": float(configured), "local": float(local)}))
