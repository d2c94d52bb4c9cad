"""Reading a sweep's inputs for each checkpoint: a VLMEvalKit-style TSV (base64 JPEGs, 448 px) checked the
way a run checks it (every image decoded), first read against the reads of the checkpoints after it, which
find the file unchanged. Medians of several runs, in one process. Figures into benchmarks/RESULTS.md
(key sweep-inputs). Run: .venv/bin/python benchmarks/bench_inputs.py --rows 2000 --write
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_infer import record  # noqa: E402


def make_tsv(path: Path, rows: int, side: int = 448) -> int:
    """A TSV of ``rows`` multiple-choice rows, each with its own JPEG; its size in bytes."""
    import random

    from PIL import Image

    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as f:
        f.write("index\timage\tquestion\tA\tB\tanswer\tcategory\n")
        for i in range(rows):
            im = Image.effect_noise((side, side), 40 + i % 20).convert("RGB")
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=85)
            f.write(f"{i}\t{base64.b64encode(buf.getvalue()).decode()}\tWhich?\tyes\tno\t{'AB'[rng.random() < 0.5]}\t"
                    f"c{i % 5}\n")
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="record the figures in benchmarks/RESULTS.md")
    args = ap.parse_args()
    import torch

    import vlmfast.inputs.requests as requests
    from vlmfast.inputs.requests import collect

    with tempfile.TemporaryDirectory() as tmp:
        tsv = Path(tmp) / "set.tsv"
        size = make_tsv(tsv, args.rows)
        first, again = [], []
        for _ in range(args.repeats):
            requests._LAST_READ.clear()  # a first read: nothing kept from an earlier one
            t0 = time.perf_counter()
            got = collect(manifest=str(tsv))
            first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            collect(manifest=str(tsv))  # the next checkpoint's read of the unchanged file
            again.append(time.perf_counter() - t0)
        assert len(got.requests) == args.rows
    a, b = statistics.median(first), statistics.median(again)
    section = (f"### A sweep's inputs, read for each checkpoint — torch {torch.__version__}\n\n"
               f"A VLMEvalKit-style TSV of {args.rows:,} rows ({size / 2**20:.0f} MB; a 448 px JPEG each, every image "
               f"decoded as a run checks it), {torch.get_num_threads()} threads; medians of {args.repeats} runs.\n\n"
               "| read | seconds |\n|---|---|\n"
               f"| first (the sweep's first checkpoint) | {a:.2f} |\n"
               f"| each later checkpoint (file unchanged) | {b:.4f} |\n\n"
               f"Before the file's state was checked, every checkpoint paid the first read: {a:.1f} s × checkpoints "
               f"(50 checkpoints: {50 * a / 60:.1f} min).\n")
    print(section)
    if args.write:
        record(section, "sweep-inputs")


if __name__ == "__main__":
    main()
