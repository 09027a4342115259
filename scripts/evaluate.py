#!/usr/bin/env python3
"""The original Salus paper's experiments in simulation: one command each, a table and a PNG plot.

  .venv/bin/python scripts/evaluate.py training     # (a) mean JCT / makespan per policy (paper: FIFO/SRTF 3.19x)
  .venv/bin/python scripts/evaluate.py hyperparam   # (b) 300 jobs x 3 models, packed vs exclusive (paper: 2.38x)
  .venv/bin/python scripts/evaluate.py inference    # (c) 14 models x 3, devices by rule (paper: 1 vs 6 vs 42)
  .venv/bin/python scripts/evaluate.py scale        # 10,000 jobs, time to simulate (target <= 10 s)
  .venv/bin/python scripts/evaluate.py all

Each runs `salus-sim experiment ...` (target/release/salus-sim, built by scripts/setup.sh) on the workload
table eval/workloads.csv, prints its table and writes PNGs and CSVs to --out-dir (default eval-out/).
--derive re-derives eval/workloads.csv from ../shared/data/salus_workloads.csv first.
See docs/EVALUATION.md for what each experiment models and how it differs from the paper.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "eval" / "workloads.csv"
SOURCE_DATA = REPO.parent / "shared" / "data" / "salus_workloads.csv"


def sim_bin() -> Path:
    path = Path(os.environ.get("SALUS_SIM_BIN", REPO / "target" / "release" / "salus-sim"))
    if not path.exists():
        sys.exit(f"evaluate: {path} not found; run scripts/setup.sh (or cargo build --release) first")
    return path


def sim(*args: str) -> None:
    result = subprocess.run([str(sim_bin()), *args], text=True, capture_output=True)
    print(result.stdout, end="")
    if result.returncode != 0:
        sys.exit(f"evaluate: salus-sim {' '.join(args)} failed:\n{result.stderr}")


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training(out: Path) -> Path:
    plt = pyplot()
    summary = rows(out / "training_summary.csv")
    fig, (bars, timeline) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [r["policy"] for r in summary]
    x = range(len(names))
    bars.bar([i - 0.2 for i in x], [float(r["mean_jct_s"]) / 3600 for r in summary], 0.4, label="mean JCT")
    bars.bar([i + 0.2 for i in x], [float(r["makespan_s"]) / 3600 for r in summary], 0.4, label="makespan")
    bars.set_xticks(list(x), names)
    bars.set_ylabel("hours")
    bars.set_title("(a) training trace: JCT and makespan per policy")
    bars.legend()
    for policy in ("fifo", "srtf", "exclusive", "mps"):
        series = rows(out / f"training_timeline_{policy}.csv")
        timeline.plot([float(r["time_s"]) / 3600 for r in series], [float(r["running"]) for r in series],
                      label=policy, linewidth=1)
    timeline.set_xlabel("hours")
    timeline.set_ylabel("jobs holding memory (running)")
    timeline.set_title("jobs running over time")
    timeline.legend()
    return save(fig, out / "training.png")


def plot_hyperparam(out: Path) -> Path:
    plt = pyplot()
    summary = rows(out / "hyperparam_summary.csv")
    fig, (bars, timeline) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [r["model"] for r in summary]
    x = range(len(names))
    bars.bar([i - 0.2 for i in x], [100 * float(r["exclusive_utilization"]) for r in summary], 0.4,
             label="exclusive")
    bars.bar([i + 0.2 for i in x], [100 * float(r["salus_utilization"]) for r in summary], 0.4,
             label="Salus (pack, lanes)")
    bars.set_xticks(list(x), names)
    bars.set_ylabel("mean device utilization %")
    bars.set_title("(b) hyper-parameter tuning, 300 jobs per model")
    bars.legend()
    for name in names:
        series = rows(out / f"hyperparam_timeline_{name}.csv")
        timeline.plot([float(r["time_s"]) / 3600 for r in series], [float(r["lanes"]) for r in series],
                      label=name, linewidth=1)
    timeline.set_xlabel("hours")
    timeline.set_ylabel("memory lanes")
    timeline.set_title("Salus lanes over time")
    timeline.legend()
    return save(fig, out / "hyperparam.png")


def plot_inference(out: Path) -> Path:
    plt = pyplot()
    summary = rows(out / "inference_summary.csv")
    memories = list(dict.fromkeys(r["memory"] for r in summary))
    rules = list(dict.fromkeys(r["rule"] for r in summary))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(memories)
    for k, memory in enumerate(memories):
        counts = [int(next(r["devices"] for r in summary if r["memory"] == memory and r["rule"] == rule))
                  for rule in rules]
        xs = [i + (k - (len(memories) - 1) / 2) * width for i in range(len(rules))]
        ax.bar(xs, counts, width, label=f"{memory} inference memory")
        for x, n in zip(xs, counts):
            ax.text(x, n, str(n), ha="center", va="bottom")
    ax.set_xticks(range(len(rules)), rules)
    ax.set_ylabel("devices needed")
    ax.set_title("(c) inference: 14 models x 3 instances")
    ax.legend()
    return save(fig, out / "inference.png")


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")
    return path


PLOTS = {"training": plot_training, "hyperparam": plot_hyperparam, "inference": plot_inference}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=[*PLOTS, "scale", "all"])
    parser.add_argument("--out-dir", type=Path, default=REPO / "eval-out")
    parser.add_argument("--derive", action="store_true", help=f"re-derive {WORKLOADS} from {SOURCE_DATA}")
    parser.add_argument("--seed", default="1")
    args = parser.parse_args()
    if args.derive:
        sim("workloads", "--from", str(SOURCE_DATA), "--out", str(WORKLOADS))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    chosen = [*PLOTS, "scale"] if args.experiment == "all" else [args.experiment]
    for experiment in chosen:
        if experiment == "scale":
            sim("scale", "--workloads", str(WORKLOADS))
            continue
        sim("experiment", experiment, "--workloads", str(WORKLOADS), "--out-dir", str(args.out_dir),
            "--seed", args.seed)
        PLOTS[experiment](args.out_dir)
        print()


if __name__ == "__main__":
    main()
