"""report.html at scale: a synthetic sweep of 50 checkpoints × 5,000 samples (box and number rows, small
images) rendered to one page; its size and the time headless Chromium takes to have it ready (page
script done: data parsed, list filled, first sample shown), median of 3 loads. Figures into
benchmarks/RESULTS.md (key html-report). Run: .venv/bin/python benchmarks/bench_html.py --write
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_infer import record  # noqa: E402


def synthetic(root: Path, steps: int, samples: int) -> dict:
    from PIL import Image

    rng = random.Random(0)
    (root / "im").mkdir(parents=True)
    sample_list = []
    for i in range(samples):
        path = root / "im" / f"{i}.png"
        Image.new("RGB", (rng.randint(200, 640), rng.randint(200, 480)), (i % 255, 80, 160)).save(path)
        box = i % 3 == 0
        sample_list.append({"id": f"sample-{i}", "prompt": "Locate the red square." if box else "How many shapes?",
                            "truth": "[10, 20, 110, 140]" if box else str(i % 7), "image_path": str(path),
                            "size": [320, 240], "truth_box": [10, 20, 110, 140] if box else None})
    checkpoints, answers = [], {}
    for k in range(steps):
        step = k * 50
        acc = 0.3 + 0.4 * k / steps
        checkpoints.append({"step": step, "label": "base" if k == 0 else "hf-trainer", "accuracy": acc,
                            "ci_low": acc - 0.013, "ci_high": acc + 0.013, "format_rate": 0.9, "new_tokens_p50": 180 + k,
                            "new_tokens_p90": 300 + 2 * k, "truncation_rate": 0.01, "repetition_rate": 0.0,
                            "tokens_per_s": 900.0})
        answers[step] = [["[12, 18, 108, 143]", int(rng.random() < acc), 0.91, [12, 18, 108, 143]] if s["truth_box"]
                         else [str(rng.randint(0, 7)), int(rng.random() < acc), 1.0, None] for s in sample_list]
    flips = {c["step"]: {"wrong_to_right": rng.sample(range(samples), min(300, samples // 4)),
                         "right_to_wrong": rng.sample(range(samples), min(200, samples // 6))}
             for c in checkpoints[1:]}
    return {"run_dir": "runs/synthetic", "best": {"step": checkpoints[-1]["step"], "label": "hf-trainer", "path": "x",
                                                  "accuracy": checkpoints[-1]["accuracy"]},
            "flags": [], "notes": [], "checkpoints": checkpoints, "samples": sample_list, "answers": answers,
            "flips": flips}


def load_ms(page: Path, profile: Path) -> tuple[float, float]:
    """(ready per the page's own clock, wall seconds of the whole browser run) for one cold load."""
    from browser import FLAGS, chromium

    start = time.perf_counter()
    r = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    ready = re.search(r'data-ready-ms="(\d+)"', r.stdout)
    errors = re.search(r'data-errors="([^"]*)"', r.stdout)
    assert ready and errors and errors.group(1) == "[]", r.stdout[-500:] + r.stderr[-500:]
    return float(ready.group(1)), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from vlmfast.report.html import write_html_report

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        page = synthetic(root, args.steps, args.samples)
        start = time.perf_counter()
        path = write_html_report(page, root / "report.html")
        write_s = time.perf_counter() - start
        size_mb = path.stat().st_size / 2**20
        embedded = path.read_text().count("data:image/jpeg;base64,")
        loads = [load_ms(path, root / f"profile-{k}") for k in range(3)]
    ready = statistics.median(r for r, _ in loads)
    wall = statistics.median(w for _, w in loads)
    lines = [
        "## report.html at 50 checkpoints × 5,000 samples",
        "",
        f"Synthetic sweep: {args.steps} checkpoints × {args.samples} samples (a third box rows), 200–640 px images "
        "of one colour each (their thumbnails are small: photos' are several times larger, fewer fit the budget).",
        "Measured with `benchmarks/bench_html.py` on this machine (2 CPU cores), headless Chromium, cold loads.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| page size | {size_mb:.1f} MiB |",
        f"| thumbnails embedded (the rest linked by path) | {embedded:,} of {args.samples:,} |",
        f"| writing the page (thumbnails included) | {write_s:.1f} s |",
        f"| ready in the browser (page script done), median of 3 | {ready / 1000:.2f} s |",
        f"| whole headless browser run (start-up included), median of 3 | {wall:.2f} s |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        record(text, "html-report")


if __name__ == "__main__":
    main()
