"""A GRPO-like checkpoint against its base with `vlmfast bench`, side by side.

Demo GRPO-like checkpoint (cache saved off) vs a base-like one (cache on), same 8 images, 128 new
tokens (forced), batch sizes 1 and 8, 1 warm-up + 3 timed runs per scenario, through the real CLI.
Records the side-by-side table, the as-saved vs vlmfast ratio and the per-step latency plot in
benchmarks/RESULTS.md (plot under benchmarks/figures/). Run: .venv/bin/python benchmarks/bench_compare_base.py --write
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_infer import HERE, record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import transformers

    from vlmfast.cli.demo import DEMO_IMAGE_SIZES
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-base-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    grpo = build_checkpoint(work / "grpo-demo", preset="demo", like="grpo")
    base = build_checkpoint(work / "base-demo", preset="demo", like="base")
    images = make_images(work / "images", n=8, sizes=DEMO_IMAGE_SIZES)
    exe = Path(sys.executable).parent / "vlmfast"
    cmd = [str(exe), "bench", "--ckpt", str(grpo), "--compare-base", str(base), "--images", str(images[0].parent),
           "--prompt", "What shapes are in this image?", "--max-new-tokens", str(args.new_tokens), "--ignore-eos",
           "--batch-sizes", "1,8", "--repeats", str(args.repeats), "--report", str(work / "report"), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"vlmfast bench exited {done.returncode}")
    report = json.loads(done.stdout)
    major = transformers.__version__.split(".")[0]
    figure = HERE / "figures" / f"compare-base-tf{major}.png"
    figure.parent.mkdir(exist_ok=True)
    shutil.copyfile(work / "report" / "plot.png", figure)

    as_saved = next(s for s in report["scenarios"] if s["name"] == "ckpt-as-saved")["step_ms"]
    ckpt8 = next(s for s in report["scenarios"] if s["name"] == "ckpt" and s["batch_size"] == 8)["step_ms"]
    body = (work / "report" / "report.md").read_text().split("\n", 2)[2]  # drop the title (temp path)
    text = "\n".join([
        f"### vlmfast bench: demo GRPO-like vs base-like — transformers {transformers.__version__}",
        "",
        "Command: `vlmfast bench --ckpt GRPO_LIKE --compare-base BASE_LIKE --images IMAGES "
        f"--max-new-tokens {args.new_tokens} --ignore-eos --batch-sizes 1,8 --repeats {args.repeats} --report DIR` "
        "(benchmarks/bench_compare_base.py).",
        "",
        body.strip(),
        "",
        f"Per-step decode latency, ckpt-as-saved (cache off): step 2 {as_saved[0]:.1f} ms → step "
        f"{len(as_saved) + 1} {as_saved[-1]:.1f} ms (rises with length); ckpt batch 8 (cache on): "
        f"{ckpt8[0]:.1f} → {ckpt8[-1]:.1f} ms (flat).",
        "",
        f"![per-step latency and throughput](figures/{figure.name})",
        "",
    ])
    print(text)
    if args.write:
        record(text, f"bench-base-tf{major}")


if __name__ == "__main__":
    main()
