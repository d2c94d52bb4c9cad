"""The bench plot: per-step decode latency per scenario (cache off rises with length, cache on stays
flat) and a throughput bar chart. matplotlib is optional (``pip install 'vlmfast[plot]'``)."""

from __future__ import annotations

from pathlib import Path


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def step_lines(report: dict) -> dict[str, list[float]]:
    """The per-step latency lines: label → median ms of decode step k (k = 1 after the first token)."""
    return {f"{s['name']} (batch {s['batch_size']})": s["step_ms"] for s in report["scenarios"] if s["step_ms"]}


def write_plot(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    fig, (steps, bars) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for label, series in step_lines(report).items():
        steps.plot(range(2, len(series) + 2), series, label=label)
    steps.set_xlabel("new token (the first one's wait is TTFT, not shown)")
    steps.set_ylabel("step latency (ms, median)")
    steps.set_title("Per-step decode latency")
    steps.legend()
    steps.grid(alpha=0.3)
    names = [f"{s['name']}\nbatch {s['batch_size']}" for s in report["scenarios"]]
    values = [s["tokens_per_s"] or 0 for s in report["scenarios"]]
    bars.bar(names, values, color=["#2b8cbe" if s["name"] != "ckpt-as-saved" else "#e34a33" for s in report["scenarios"]])
    bars.set_ylabel("tokens/s (median)")
    bars.set_title("Throughput")
    for i, v in enumerate(values):
        bars.annotate(f"{v:.0f}", (i, v), ha="center", va="bottom")
    fig.suptitle(f"vlmfast bench — {Path(report['checkpoint']).name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_sweep_plot(report: dict, path: Path) -> Path:
    """Accuracy (with its 95 % interval) and format rate against the training step, one point per checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [c for c in report["checkpoints"] if c["accuracy"] is not None]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = [c["step"] for c in points]
    accuracy = [c["accuracy"] for c in points]
    below = [c["accuracy"] - c["ci_low"] for c in points]
    above = [c["ci_high"] - c["accuracy"] for c in points]
    ax.errorbar(steps, accuracy, yerr=[below, above], marker="o", capsize=3, label="accuracy (95 % interval)")
    formats = [(c["step"], c["format_rate"]) for c in report["checkpoints"] if c["format_rate"] is not None]
    if formats:
        ax.plot(*zip(*formats), marker="s", linestyle="--", label="format rate")
    if report.get("best"):
        ax.annotate("best", (report["best"]["step"], report["best"]["accuracy"]), textcoords="offset points",
                    xytext=(0, 10), ha="center")
    ax.set_xlabel("training step (0: base)")
    ax.set_ylabel("share of answers (%)")
    ax.set_ylim(-0.02, 1.02)
    ax.yaxis.set_major_formatter(lambda value, _: f"{value * 100:.0f}")  # as the table and the page show them
    ax.set_title(f"vlmfast sweep — {Path(report['run_dir']).name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
