"""`salus timeline --png`: the server's recent runs as a per-lane Gantt chart (PNG).

The `salus` CLI (Rust) pipes the timeline's JSON into `python -m salus._timeline --png FILE`; the text summary
and `--json` are the CLI's own.

The input is the JSON of `salus timeline --json` (admin.timeline_json): times are seconds before the
server's "now", so the chart's axis runs from -S to 0 whatever the clocks of client and server say.
"""

from __future__ import annotations

NO_LANE = "no lane"
# Jobs named in the legend, the busiest first; the rest are counted in one entry.
LEGEND_JOBS = 12


def _lane_key(lane):
    # Lanes in order, runs before memory admission (no lane) last.
    return (lane is None, lane if lane is not None else 0)


def _job_label(span: dict) -> str:
    name = span["name"] or "?"
    kind = f", {span['kind']}" if span["kind"] else ""
    return f"{name} (job {span['job']}{kind})"


def window_of(t: dict) -> float:
    """The window the timeline covers: the one asked for, or back to its oldest span."""
    if t["seconds"] > 0:
        return t["seconds"]
    return max((s["start_ago_s"] for s in t["spans"]), default=0.0)


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed."""


def draw_png(t: dict, path: str) -> None:
    """A Gantt chart: one row per lane, one colour per job; main iterations fill the row's bar, cheap
    runs are the thin hatched strip under it."""
    try:
        import matplotlib
    except ImportError:
        raise ChartUnavailable("salus timeline --png draws with matplotlib, which is not installed: "
                               "python -m pip install matplotlib") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans = t["spans"]
    window = window_of(t)
    lanes = sorted({s["lane"] for s in spans}, key=_lane_key)
    if not lanes:
        lanes = [0]
    row = {lane: i for i, lane in enumerate(lanes)}
    jobs: dict = {}
    for s in spans:
        jobs.setdefault(s["job"], _job_label(s))
    colours = plt.get_cmap("tab10" if len(jobs) <= 10 else "tab20").colors
    colour = {job: colours[i % len(colours)] for i, job in enumerate(sorted(jobs))}

    busy: dict = {}
    for s in spans:
        busy[s["job"]] = busy.get(s["job"], 0.0) + s["start_ago_s"] - s["end_ago_s"]
    named = sorted(jobs, key=lambda j: (-busy.get(j, 0.0), j))[:LEGEND_JOBS]
    legend_rows = len(named) + 3
    # Tall enough for the lanes and for the legend beside them.
    fig, ax = plt.subplots(figsize=(12, max(1.2 + 0.9 * len(lanes), 0.8 + 0.19 * legend_rows)), dpi=110)
    # Offsets from a row's centre; the y axis runs downwards (lane 0 on top), so the cheap strip is under
    # the main bar.
    for job in sorted(jobs):
        for run, y0, height in (("main", -0.42, 0.56), ("cheap", 0.2, 0.2)):
            for lane in lanes:
                bars = [(-s["start_ago_s"], s["start_ago_s"] - s["end_ago_s"]) for s in spans
                        if s["job"] == job and s["run"] == run and s["lane"] == lane]
                if not bars:
                    continue
                # An edge of the bar's own colour keeps millisecond runs visible at a
                # seconds scale; the gaps between them stay white.
                ax.broken_barh(bars, (row[lane] + y0, height), facecolors=colour[job],
                               edgecolors=colour[job], linewidth=0.4,
                               hatch="////" if run == "cheap" else None, alpha=1.0 if run == "main" else 0.7)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"lane {lane}" if lane is not None else NO_LANE for lane in lanes])
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(-max(window, 1e-3), 0)
    ax.set_xlabel("seconds before now (server clock)")
    ax.grid(axis="x", linestyle=":", linewidth=0.6)
    ax.set_title(f"salus timeline: {len(spans)} runs in the last {window:.3g} s", loc="left")
    handles = [Patch(facecolor=colour[j], label=jobs[j]) for j in sorted(named)]
    if len(jobs) > len(named):
        handles.append(Patch(facecolor="white", edgecolor="0.6",
                             label=f"+{len(jobs) - len(named)} less busy jobs (colours repeat)"))
    handles += [Patch(facecolor="0.6", label="main iteration (tall bar)"),
                Patch(facecolor="0.8", hatch="////", label="cheap run (thin strip)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=8,
              frameon=False)
    if not spans:
        ax.text(0.5, 0.5, "no runs in this window", transform=ax.transAxes, ha="center", va="center")
    # The legend sits outside the axes: let the saved image grow to hold it.
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """`python -m salus._timeline --png FILE`: the JSON of `salus timeline --json` on stdin, drawn into FILE."""
    import argparse
    import json
    import sys
    p = argparse.ArgumentParser(prog="python -m salus._timeline",
                                description="Draw `salus timeline --json` (read from stdin) as a PNG.")
    p.add_argument("--png", metavar="FILE", required=True)
    args = p.parse_args(argv)
    try:
        t = json.load(sys.stdin)
        draw_png(t, args.png)
    except ChartUnavailable as e:
        sys.stderr.write(f"salus: {e}\n")
        return 1
    except (ValueError, KeyError) as e:
        sys.stderr.write(f"salus: the timeline on stdin is not `salus timeline --json`: {e}\n")
        return 1
    except OSError as e:
        sys.stderr.write(f"salus: cannot write {args.png}: {e}\n")
        return 1
    sys.stdout.write(f"{args.png}: {len(t['spans'])} runs in the last {window_of(t):.3g} s\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
