#!/usr/bin/env python3
"""The original Salus paper's experiments in simulation: one command each, a table and a PNG plot.

  .venv/bin/python scripts/evaluate.py training     # (a) mean JCT / makespan per policy, 1/5/10-minute and heavy-tailed lengths (paper: FIFO/SRTF 3.19x)
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


def grouped_bars(ax, names: list[str], series: dict[str, list[float]], ylabel: str, title: str,
                 annotate: bool = False) -> None:
    """One group of bars per name, one bar per series."""
    width = 0.8 / len(series)
    for k, (label, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, values, width, label=label)
        if annotate:
            for x, v in zip(xs, values):
                ax.text(x, v, f"{v:g}", ha="center", va="bottom")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()


def timelines(ax, out: Path, files: dict[str, str], column: str, ylabel: str, title: str) -> None:
    """One line per label: `column` of a timeline CSV over time, in hours."""
    for label, name in files.items():
        series = rows(out / name)
        ax.plot([float(r["time_s"]) / 3600 for r in series], [float(r[column]) for r in series],
                label=label, linewidth=1)
    ax.set_xlabel("hours")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()


def plot_training(out: Path) -> Path:
    summary = rows(out / "training_summary.csv")
    heavy = rows(out / "training_heavy_summary.csv")
    fig, (bars, heavy_bars, timeline) = pyplot().subplots(1, 3, figsize=(19, 4.5))
    grouped_bars(bars, [r["policy"] for r in summary],
                 {"mean JCT": [float(r["mean_jct_s"]) / 3600 for r in summary],
                  "makespan": [float(r["makespan_s"]) / 3600 for r in summary]},
                 "hours", "(a) training trace (1/5/10 min): JCT and makespan")
    # FIFO, SRTF, LAS, DLAS, Gittins and the offline bound on heavy-tailed lengths.
    grouped_bars(heavy_bars, [r["policy"] for r in heavy],
                 {"mean JCT": [float(r["mean_jct_s"]) / 3600 for r in heavy],
                  "makespan": [float(r["makespan_s"]) / 3600 for r in heavy]},
                 "hours", "(a) heavy-tailed lengths (log-normal)")
    timelines(timeline, out, {p: f"training_timeline_{p}.csv" for p in ("fifo", "srtf", "exclusive", "mps")},
              "running", "jobs holding memory (running)", "jobs running over time")
    return save(fig, out / "training.png")


def plot_hyperparam(out: Path) -> Path:
    summary = rows(out / "hyperparam_summary.csv")
    names = [r["model"] for r in summary]
    fig, (bars, timeline) = pyplot().subplots(1, 2, figsize=(13, 4.5))
    grouped_bars(bars, names,
                 {"exclusive": [100 * float(r["exclusive_utilization"]) for r in summary],
                  "Salus (pack policy), lane rule salus": [100 * float(r["salus_utilization"]) for r in summary],
                  "Salus (pack policy), lane rule pack": [100 * float(r["pack_utilization"]) for r in summary]},
                 "mean device utilization %", "(b) hyper-parameter tuning, 300 jobs per model")
    timelines(timeline, out, {n: f"hyperparam_timeline_{n}.csv" for n in names}, "lanes", "memory lanes",
              "Salus lanes over time")
    return save(fig, out / "hyperparam.png")


def plot_inference(out: Path) -> Path:
    summary = rows(out / "inference_summary.csv")
    memories = list(dict.fromkeys(r["memory"] for r in summary))
    rules = list(dict.fromkeys(r["rule"] for r in summary))
    devices = {(r["memory"], r["rule"]): float(r["devices"]) for r in summary}
    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    grouped_bars(ax, rules, {f"{m} inference memory": [devices[m, rule] for rule in rules] for m in memories},
                 "devices needed", "(c) inference: 14 models x 3 instances", annotate=True)
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
