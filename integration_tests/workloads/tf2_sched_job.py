"""The TF2 twin of sched_job.py for the scheduler benchmarks: the same model and iteration shape (mlp_small: 3 dense
layers of 512 + ReLU, a 10-way softmax cross-entropy on a fixed batch of 256 x 64, momentum SGD 0.01/0.9, glorot
initial weights from numpy(seed)), written as TF2 code: a tf.function training step (GradientTape, momentum by
hand) called N times, each call's loss fetched (float()). No salus import: run with SALUS_SERVER set, the adapter's
startup hook sends the eager work to the server as one job (hints: SALUS_JOB_NAME, SALUS_EXPECTED_ITERATIONS,
SALUS_EXPECTED_SECONDS, SALUS_PRIORITY; the caller turns a "NAME?iterations=N" name into those); without it the job
runs in-process. The server sees one repeated function call per step: after its first two calls (cheap, run at
once) every call is a main iteration that the scheduler orders.

--model mlp_small | mlp_large | tiny (sched_job.py's sizes); --tiny = --model tiny, a step of well under a
millisecond; --force-main then names the step function `salus_main_iter`, which makes every call a main
iteration regardless of its duration (as sched_job.py's salus_main_iter fetch does for a graph job).

Start protocol (as sched_job.py): with --go-file the script imports TensorFlow and prepares its numpy data,
touches --ready-file, then waits for the go file (its content, a target, is not used: the server comes from
SALUS_SERVER). After that it creates its variables (the first eager op opens the job's eager context on the
server: that is where the job arrives, as a graph job arrives at CreateSession) and traces the step function
(TensorFlow connects at the first eager op and tracing needs the variables, so neither can happen before the go:
this setup, ~0.2 s alone on a 2-core machine, is inside the job's time, where a graph job's is its graph
construction before the go plus CreateSession and the init run after it).

CLI: python tf2_sched_job.py --name NAME [--seed N] [--steps N | --seconds S] [--model M | --tiny] [--force-main]
                             [--ready-file F --go-file G] [--digest-only] [--step-times] [--no-close]
prints one JSON line after the last step, with sched_job.py's keys ({"name", "model", "seed", "steps", "losses"
(unless --digest-only), "digest", "go", "start", "end", "step_ms_median", "step_ms_p95"}) plus "kind": "tf2" and
"device" (where the variables live: /job:worker/... on the server). "go": wall clock when the go file appeared;
"start": after the variables were created and the step traced, just before the first step; "end": after the last
step's loss arrived; then {"phase": "closed", "closed", "close_error"} once the job's eager context was closed on
the server (close_remote_context; --no-close exits as the stock client does, leaving it to the server's reclaim).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

IN_DIM, OUT_DIM = 64, 10
MODELS = {"mlp_small": dict(width=512, depth=3, batch=256), "mlp_large": dict(width=1024, depth=4, batch=256),
          "tiny": dict(width=32, depth=1, batch=16)}
THREADS = 2  # intra- and inter-op threads, as sched_job.py

tf.config.threading.set_intra_op_parallelism_threads(THREADS)
tf.config.threading.set_inter_op_parallelism_threads(THREADS)


def glorot(rng, fan_in: int, fan_out: int) -> np.ndarray:
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)


def build(seed: int, model: str, force_main: bool):
    size = MODELS[model]
    rng = np.random.RandomState(seed)
    x = tf.constant(rng.normal(size=(size["batch"], IN_DIM)).astype(np.float32))
    y = tf.constant(rng.randint(0, OUT_DIM, size=size["batch"]).astype(np.int64))
    params, d = [], IN_DIM
    for i in range(size["depth"]):
        params.append(tf.Variable(glorot(rng, d, size["width"]), name=f"w{i}"))
        params.append(tf.Variable(np.zeros(size["width"], np.float32), name=f"b{i}"))
        d = size["width"]
    params.append(tf.Variable(glorot(rng, d, OUT_DIM), name="wo"))
    slots = [tf.Variable(tf.zeros_like(v)) for v in params]

    def step():
        with tf.GradientTape() as tape:
            h = x
            for i in range(size["depth"]):
                h = tf.nn.relu(tf.matmul(h, params[2 * i]) + params[2 * i + 1])
            logits = tf.matmul(h, params[-1])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        for slot, g, v in zip(slots, tape.gradient(loss, params), params):  # MomentumOptimizer(0.01, 0.9)
            slot.assign(0.9 * slot + g)
            v.assign_sub(0.01 * slot)
        return loss

    # The function's name is what the server sees: `salus_main_iter` forces main iterations.
    step.__name__ = "salus_main_iter" if force_main else "train_step"
    fn = tf.function(step)
    fn.get_concrete_function()  # trace now, before the clock starts
    return fn, params[0].device


def digest(losses) -> str:
    return hashlib.sha256(struct.pack(f"<{len(losses)}d", *losses)).hexdigest()[:16]


def close_remote_context() -> str | None:
    """Closes this process's eager context on the server now (EagerService/CloseContext, hand-encoded over grpcio:
    CloseContextRequest{context_id=1 fixed64}), as a graph job's session.close() closes its session. The stock
    client never closes it (it just exits, and the server reclaims the context 3 s after its stream ended), and a
    strict-FIFO lane is held until its job is gone. Returns an error message, or None."""
    import grpc
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context

    server = os.environ.get("SALUS_SERVER", "").removeprefix("grpc://")
    context_id = pywrap_tfe.TFE_GetContextId(context.context()._handle)  # noqa: SLF001 (the id CreateContext sent)
    request = bytes([(1 << 3) | 1]) + context_id.to_bytes(8, "little")
    try:
        from salus._token import grpc_options  # the tenant's token (SALUS_TOKEN), as TensorFlow's own calls carry it
        with grpc.insecure_channel(server, options=grpc_options()) as ch:
            ch.unary_unary("/tensorflow.eager.EagerService/CloseContext", request_serializer=None,
                           response_deserializer=None)(request, timeout=30)
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"
    return None


def wait_for(go_file: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit(f"tf2_sched_job: no go file {go_file} within {timeout}s")
        time.sleep(0.005)
    with open(go_file) as f:
        return f.read().strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="", help="ignored (the server comes from SALUS_SERVER)")
    ap.add_argument("--name", default="", help="reported only; hints come from SALUS_* variables")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=0.0, help="train until this many seconds passed instead")
    ap.add_argument("--model", default="mlp_small", choices=sorted(MODELS))
    ap.add_argument("--tiny", action="store_true", help="same as --model tiny")
    ap.add_argument("--force-main", action="store_true")
    ap.add_argument("--ready-file")
    ap.add_argument("--go-file")
    ap.add_argument("--digest-only", action="store_true")
    ap.add_argument("--step-times", action="store_true",
                    help="also print each step's wall time (ms) and end (s after start)")
    ap.add_argument("--no-close", action="store_true", help="exit without closing the eager context (stock client)")
    args = ap.parse_args()
    model = "tiny" if args.tiny else args.model

    if args.go_file:
        if args.ready_file:
            open(args.ready_file, "w").close()
        wait_for(args.go_file)
    go = time.time()
    step, device = build(args.seed, model, args.force_main)  # the job (eager context) is created here
    start = time.time()
    losses, times, ends = [], [], []
    deadline = time.monotonic() + args.seconds
    p0 = time.perf_counter()
    while (len(losses) < args.steps) if not args.seconds else (time.monotonic() < deadline):
        t0 = time.perf_counter()
        loss = float(step())
        t1 = time.perf_counter()
        times.append(t1 - t0)
        ends.append(t1 - p0)
        losses.append(loss)
    end = time.time()
    times_ms = sorted(t * 1000 for t in times) or [0.0]
    result = {"name": args.name, "kind": "tf2", "model": model, "seed": args.seed, "steps": len(losses),
              "digest": digest(losses), "go": go, "start": start, "end": end, "device": device,
              "step_ms_median": times_ms[len(times_ms) // 2],
              "step_ms_p95": times_ms[min(len(times_ms) - 1, int(len(times_ms) * 0.95))]}
    if not args.digest_only:
        result["losses"] = losses
    if args.step_times:
        result["step_ms"] = [round(t * 1000, 3) for t in times]
        result["step_end_s"] = [round(t, 5) for t in ends]
    # The result line first: the benchmark takes a job's end from it, and the close must not delay the next job.
    print(json.dumps(result), flush=True)
    error = None
    if not args.no_close and device.startswith("/job:worker"):
        error = close_remote_context()
    print(json.dumps({"phase": "closed", "closed": time.time(), "close_error": error}), flush=True)
    sys.stderr.flush()
    os._exit(0)  # skip TensorFlow's teardown, as sched_job.py


if __name__ == "__main__":
    main()
