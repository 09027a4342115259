"""An unmodified TF2 script: a tf.function training step on a 512x512 variable (1 MiB), called STEPS times.

argv: STEPS [HOLD_AFTER]. After HOLD_AFTER steps (default: never) it prints HOLD and waits for a line on stdin;
HOLD_AFTER "start" holds after `import tensorflow` but before the first eager op, so before the client's eager
context exists on the server (the adapter connects at the first eager op).
With the environment variable TF2_STEPS_MEMORY=heap (in-process runs, integration_tests/c_programs/heap_peak.c
preloaded), the JSON line also has "step_heap_peak_bytes": the peak rise of the process's heap during one more
step, measured after the others: the quantity salus-server measures for an eager call. With
TF2_STEPS_MEMORY=allocator (and TF_CPU_ALLOCATOR_USE_BFC=true), "step_allocator_rises": for each step, the CPU
allocator's peak above its use at the step's start, as get_memory_info reads it.
Prints one JSON line at the end: {"steps", "start", "end", "values": [...first 3...], "device"}; if a step fails,
{"error": class name, "message": ...} instead.
"""

import json
import os
import sys
import time

import tensorflow as tf

steps = int(sys.argv[1])
hold_at_start = len(sys.argv) > 2 and sys.argv[2] == "start"
hold_after = int(sys.argv[2]) if len(sys.argv) > 2 and not hold_at_start else -1
if hold_at_start:
    print("HOLD", flush=True)
    sys.stdin.readline()
w = tf.Variable(tf.ones([512, 512]) * 1e-3)


@tf.function
def step(x):
    y = tf.matmul(x, w)
    for _ in range(3):
        y = tf.matmul(y, w)
    w.assign_add(y * 1e-6)
    return tf.reduce_sum(y)


x = tf.ones([512, 512])
values = []
# TF2_STEPS_MEMORY=allocator: TensorFlow's own accounting of every step, as get_memory_info reads it.
allocator_rises = [] if os.environ.get("TF2_STEPS_MEMORY") == "allocator" else None
start = time.time()
try:
    for i in range(steps):
        if i == hold_after:
            print("HOLD", flush=True)
            sys.stdin.readline()
        if allocator_rises is not None:
            tf.config.experimental.reset_memory_stats("CPU:0")
            before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        values.append(float(step(x).numpy()))
        if allocator_rises is not None:
            allocator_rises.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
except tf.errors.OpError as e:
    print(json.dumps({"error": type(e).__name__, "message": e.message[:2000], "after": len(values)}), flush=True)
    sys.exit(0)
result = {"steps": steps, "start": start, "end": time.time(), "values": values[:3], "device": w.handle.device}
if os.environ.get("TF2_STEPS_MEMORY") == "heap":
    import ctypes

    meter = ctypes.CDLL(None)  # integration_tests/c_programs/heap_peak.c, LD_PRELOADed
    meter.salus_heap_meter_stop.restype = ctypes.c_long
    meter.salus_heap_meter_start()
    step(x).numpy()
    result["step_heap_peak_bytes"] = meter.salus_heap_meter_stop()
elif allocator_rises is not None:
    result["step_allocator_rises"] = allocator_rises
print(json.dumps(result), flush=True)
