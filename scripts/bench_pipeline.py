#!/usr/bin/env python3
"""What Python in the input pipeline costs through Salus: a Keras 3 fit on a PyDataset (its __getitem__ runs in
the script's process, called back by the server's pipeline for each batch) against the same fit in-process and
against the same fit on numpy arrays through the server (Keras then builds its whole pipeline on the server).

Each client is a fresh process that builds one model, fits one warm-up epoch and then times EPOCHS epochs;
the three clients run interleaved, ROUNDS times, and the ratios of their per-step times are printed per round
and as min / median / max over the rounds. No goal is asserted: the machine is shared and noisy.

    scripts/bench_pipeline.py                  # starts its own salus-server (release build)
    scripts/bench_pipeline.py --server ADDR    # a running server
    scripts/bench_pipeline.py --rounds 5 --steps 60 --batch 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
SERVER_BIN = ROOT / "target" / "release" / "salus-server"
CLIENTS = ("pydataset_inprocess", "pydataset_server", "numpy_server")


def client_main(mode: str, steps: int, batch: int, epochs: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    rng = np.random.RandomState(0)
    x = rng.normal(size=(steps * batch, 128)).astype(np.float32)
    y = rng.randint(0, 10, size=(steps * batch,)).astype(np.int64)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return steps

        def __getitem__(self, i):
            return x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((128,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if mode.startswith("pydataset"):
        data, kwargs = Batches(), {}
    else:
        data, kwargs = x, {"y": y, "batch_size": batch, "shuffle": False}
    model.fit(data, epochs=1, verbose=0, **kwargs)  # warm-up: tracing, first transfers
    start = time.perf_counter()
    model.fit(data, epochs=epochs, verbose=0, **kwargs)
    elapsed = time.perf_counter() - start
    print(json.dumps({"step_ms": 1000 * elapsed / (epochs * steps)}), flush=True)
    os._exit(0)  # see workloads/tf2_python_pipeline.py: no exit-time collection of a mid-stream prefetch


def run_client(mode: str, server: str, args) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALUS_") and k != "TF_USE_LEGACY_KERAS"}
    if mode.endswith("_server"):
        env["SALUS_SERVER"] = server
    proc = subprocess.run([PYTHON, __file__, "--client", mode, "--steps", str(args.steps), "--batch",
                           str(args.batch), "--epochs", str(args.epochs)],
                          capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"{mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["step_ms"]


def start_server() -> tuple[subprocess.Popen, str]:
    if not SERVER_BIN.exists():
        sys.exit(f"{SERVER_BIN} not found: run scripts/setup.sh first")
    proc = subprocess.Popen([str(SERVER_BIN), "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.startswith("salus-server listening on "):
            return proc, line.split()[-1]
    sys.exit("salus-server exited before listening")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", help="address of a running salus-server (default: start one)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three clients (default 3)")
    ap.add_argument("--steps", type=int, default=50, help="steps per epoch (default 50)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per client (default 2)")
    ap.add_argument("--client", choices=CLIENTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        client_main(args.client, args.steps, args.batch, args.epochs)
        return 0
    server_proc = None
    server = args.server
    if server is None:
        server_proc, server = start_server()
    try:
        print(f"Keras fit, MLP 128-256-256-10, batch {args.batch}, {args.steps} steps x {args.epochs} epochs per "
              f"client, server {server}")
        ratios: dict[str, list[float]] = {"pydataset server / in-process": [],
                                          "pydataset server / numpy server": []}
        for r in range(args.rounds):
            ms = {mode: run_client(mode, server, args) for mode in CLIENTS}
            a = ms["pydataset_server"] / ms["pydataset_inprocess"]
            b = ms["pydataset_server"] / ms["numpy_server"]
            ratios["pydataset server / in-process"].append(a)
            ratios["pydataset server / numpy server"].append(b)
            print(f"round {r + 1}: step ms  " + "  ".join(f"{m} {v:.2f}" for m, v in ms.items())
                  + f"   ratios {a:.2f} {b:.2f}", flush=True)
        print("ratios (min / median / max over rounds):")
        for name, values in ratios.items():
            print(f"  {name:34s} {min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}")
    finally:
        if server_proc is not None:
            server_proc.terminate()
            server_proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
