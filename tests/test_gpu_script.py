"""benchmarks/gpu.sh plans steps that fit 10-minute slices and skips what is done; gpu_table.py rebuilds
one table from every report left in the output directory. Both run here without a GPU."""

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.transformers_independent  # bash and a fake Python: the same under every transformers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu.sh"
TABLE = ROOT / "benchmarks" / "gpu_table.py"
STEPS = ["build", "default-b1", "default-b8-32", "compile-b1", "compile-b8-32", "hf-b1", "hf-b32", "infer", "lengths", "prefill", "prefill-compiled",
         "decode-attention", "kernels"]
SLICE_LIMIT_S = 8 * 60  # every step must leave room in a 10-minute command slice


def _env(out: Path, env: dict) -> dict:
    # RESULTS.md untouched; OUT (the folder a lent machine's tool brings back) only where a test sets it
    return {**os.environ, "OUT_DIR": str(out), "WRITE_RESULTS": "0", "PLAN": "full", "OUT": "",
            **{k: str(v) for k, v in env.items()}}


def gpu_sh(out: Path, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=_env(out, env))


def plan(stdout: str) -> list[tuple[str, str, str]]:
    """(run | skip, step name, the rest of the line) per planned step."""
    return [tuple(line.split(None, 2)) for line in stdout.splitlines() if line.startswith(("run ", "skip "))]


def _touch(path: Path, text: str = "{}") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_dry_run_plans_every_step_and_skips_finished_reports(tmp_path):
    out = tmp_path / "out"
    _touch(out / "ckpt/qwen2.5-vl-3b-grpo/vlmfast_tiny.json")
    _touch(out / "reports/qwen2.5-vl-3b-grpo-default-b1/report.json")
    _touch(out / "reports/qwen2.5-vl-3b-grpo-infer/second.json")
    _touch(out / "reports/qwen2.5-vl-3b-grpo-hf-b1/report.json", "")  # empty: a step cut short, not done
    (out / "reports/qwen2.5-vl-7b-grpo-hf-b32").mkdir(parents=True)  # a dir without its report.json: not done
    r = gpu_sh(out, "--dry-run", PYTHON="/nonexistent/python")  # the plan needs neither Python nor a GPU
    assert r.returncode == 0, r.stderr
    steps = plan(r.stdout)
    assert [name for _, name, _ in steps] == (["vision"] + [f"qwen2.5-vl-{size}-grpo/{s}" for size in ("3b", "7b") for s in STEPS]
                                              + ["cuda-tests"])
    assert {name for action, name, _ in steps if action == "skip"} == {
        "qwen2.5-vl-3b-grpo/build", "qwen2.5-vl-3b-grpo/default-b1", "qwen2.5-vl-3b-grpo/infer"}
    runs = {name: rest for action, name, rest in steps if action == "run"}
    estimates = {name: int(rest.split()[0].lstrip("~")) for name, rest in runs.items()}
    assert all(0 < s <= SLICE_LIMIT_S for s in estimates.values()), estimates
    assert estimates["qwen2.5-vl-7b-grpo/hf-b1"] > estimates["qwen2.5-vl-3b-grpo/hf-b1"]
    # batch 1 of plain generate on 8 images (4,096 token-steps), batch 32 on all 32
    hf1, hf32 = runs["qwen2.5-vl-3b-grpo/hf-b1"], runs["qwen2.5-vl-7b-grpo/hf-b32"]
    assert f"--decoder hf --images {out}/images-8 --batch-sizes 1 --report {out}/reports/qwen2.5-vl-3b-grpo-hf-b1" in hf1
    assert f"--images {out}/images-32 --batch-sizes 32 " in hf32 and "--max-new-tokens 128" in hf32
    assert not (out / "images-32").exists()  # a dry run makes nothing
    env_dry = gpu_sh(out, DRY_RUN="1", PYTHON="/nonexistent/python")
    assert env_dry.returncode == 0 and plan(env_dry.stdout) == steps


def test_the_default_plan_runs_its_steps_by_value(tmp_path):
    """PLAN=one: the CUDA tests first, then the 3B shape only, in the order a slice cut short should keep —
    batch 1 compiled with its default attention (two products on CUDA) and with SDPA's, batch 32 by default,
    the decode attention's candidates, batch 1 by default, the compiled prefill, the real-length mix last. The steps up to both
    compiled ones fit the one-call lease's SLICE_S=420 by their estimates; each step's limit is 2 × its
    estimate + 60 s."""
    out = tmp_path / "out"
    r = gpu_sh(out, "--dry-run", PLAN="one")
    assert r.returncode == 0, r.stderr
    steps = plan(r.stdout)
    assert [name for _, name, _ in steps] == ["cuda-tests"] + [f"qwen2.5-vl-3b-grpo/{s}" for s in (
        "build", "default-b32", "compile-b1", "compile-sdpa-b1", "default-b1", "kernels", "decode-attention",
        "prefill-compiled", "lengths")]
    estimates = [int(rest.split()[0].lstrip("~")) for _, _, rest in steps]
    assert estimates[0] >= 180 and sum(estimates[:4]) <= 420  # the CUDA tests, TTFT and 32 × 128, batch 1 compiled
    assert all(f", limit {2 * e + 60} s: " in rest for e, (_, _, rest) in zip(estimates, steps))
    runs = {name: rest for _, name, rest in steps}
    sdpa = runs["qwen2.5-vl-3b-grpo/compile-sdpa-b1"]
    assert sdpa.split(": ", 1)[1].startswith("VLMFAST_DECODE_ATTENTION=sdpa vlmfast bench ")
    assert f"--compile --images {out}/images-8 --batch-sizes 1 --report {out}/reports/qwen2.5-vl-3b-grpo-compile-sdpa-b1" in sdpa
    assert [name for name, rest in runs.items() if "VLMFAST_DECODE_ATTENTION" in rest] == ["qwen2.5-vl-3b-grpo/compile-sdpa-b1"]
    assert gpu_sh(out, "--dry-run", PLAN="one", STEP_LIMIT_S="30").stdout.count(", limit 30 s: ") == len(steps)
    assert f"--images {out}/images-32 --batch-sizes 32 " in runs["qwen2.5-vl-3b-grpo/default-b32"]
    assert "--runs 1 --modes static,continuous " in runs["qwen2.5-vl-3b-grpo/lengths"]
    assert f"--batch 32 --compile --json {out}/reports/qwen2.5-vl-3b-grpo-compiled-prefill.json" in runs[
        "qwen2.5-vl-3b-grpo/prefill-compiled"]
    assert [name for name, rest in runs.items() if "--compile" in rest] == [
        "qwen2.5-vl-3b-grpo/compile-b1", "qwen2.5-vl-3b-grpo/compile-sdpa-b1", "qwen2.5-vl-3b-grpo/prefill-compiled"]
    assert f"--compile --images {out}/images-8 --batch-sizes 1 " in runs["qwen2.5-vl-3b-grpo/compile-b1"]
    default = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in {**os.environ, "OUT_DIR": str(out)}.items() if k != "PLAN"})
    assert plan(default.stdout) == steps
    bad = gpu_sh(out, "--dry-run", PLAN="quick")
    assert bad.returncode == 2 and "unknown PLAN 'quick'" in bad.stderr


def test_dry_run_with_a_checkpoint_and_chosen_modes(tmp_path):
    r = gpu_sh(tmp_path / "out", "--dry-run", "/models/my-ckpt", MODES="compile")
    assert r.returncode == 0, r.stderr
    assert [(a, n) for a, n, _ in plan(r.stdout)] == [
        ("run", "vision"), ("run", "my-ckpt/compile-b1"), ("run", "my-ckpt/compile-b8-32"), ("run", "my-ckpt/infer"),
        ("run", "my-ckpt/lengths"), ("run", "my-ckpt/prefill"), ("run", "my-ckpt/prefill-compiled"),
        ("run", "my-ckpt/decode-attention"), ("run", "my-ckpt/kernels"), ("run", "cuda-tests")]
    assert "--preset 3b --ckpt /models/my-ckpt --device cuda" in plan(r.stdout)[-6][2]
    assert "--ckpt /models/my-ckpt" in plan(r.stdout)[1][2]
    bad = gpu_sh(tmp_path / "out", "--dry-run", MODES="fast")
    assert bad.returncode == 2 and "unknown mode 'fast'" in bad.stderr


def test_a_missing_package_fails_loudly(tmp_path):
    # a Python without site-packages: no torch, and no pip to install it with
    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    r = gpu_sh(tmp_path / "out", PYTHON=bare, SIZES="3b", WHEELS="")
    assert r.returncode == 2 and "missing Python package 'torch'" in r.stderr and "WHEELS=DIR" in r.stderr
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    r = gpu_sh(tmp_path / "out", PYTHON=bare, SIZES="3b", WHEELS=wheels)
    assert r.returncode == 2 and f"pip could not install 'torch' from {wheels}" in r.stderr
    assert f"will install from {wheels} (no index): torch" in r.stdout + r.stderr
    (wheels / "torch-2.0.0-cp27-cp27mu-linux_x86_64.whl").write_bytes(b"")  # built for another Python
    r = gpu_sh(tmp_path / "out", PYTHON=bare, SIZES="3b", WHEELS=wheels)
    assert r.returncode == 2 and "built for cp27" in r.stderr and "pip could not install" not in r.stderr


# Stands in for the GPU machine's Python: the checks pass, and each vlmfast command leaves behind what the
# real one would (a checkpoint stamp, images, a bench report, infer JSON); anything else runs for real.
FAKE_PYTHON = """#!{python}
import json, os, sys
sys.path.insert(0, {tests!r})
from test_gpu_script import _bench_report, _infer_report, _vision_report

args = sys.argv[1:]
if os.environ.get("HANG_MODE") and os.environ["HANG_MODE"] in " ".join(args):
    # a step that never ends, with a child of its own; both hold the test's FIFO open while they live
    import signal, subprocess
    fifo = open(os.environ["HANG_FIFO"], "w")
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], pass_fds=[fifo.fileno()])
    fifo.write(f"{{os.getpid()}} {{child.pid}}\\n")
    fifo.flush()
    signal.pause()
if args[:1] == ["-"]:  # a script on stdin: the package check (nothing missing) or the device file
    if "get_device_name" in sys.stdin.read():
        json.dump({{"gpu": "Fake GPU", "cuda": "0.0"}}, open(args[1], "w"))
elif args[:1] == ["-c"]:
    pass
elif args[0].endswith("bench_vision.py"):
    json.dump(_vision_report(), open(args[args.index("--json") + 1], "w"))
elif args[0].endswith("bench_lengths.py"):
    json.dump({{"preset": args[args.index("--preset") + 1], "device": "cuda",
               "useful_tokens_per_s": {{"static batches": 2000.0, "continuous": 3600.0}},
               "modes": {{"static batches": {{"answer_tokens": 50000, "row_steps": 100000}},
                         "continuous": {{"answer_tokens": 50000, "row_steps": 62500, "prefills": 32, "prefill_s": 2.5,
                                        "decode_steps": 2000}}}}}},
              open(args[args.index("--json") + 1], "w"))
elif args[0].endswith("profile_prefill.py"):
    compiled = "--compile" in args
    json.dump({{"images": 32, "prefill_groups": [16, 16], "wall_ms": 300.0 if compiled else 400.0,
               "vision_ms": 150.0 if compiled else 250.0, "rope_index_ms": 10.0, "language_ms": 140.0,
               "compiled_vision": compiled, "compile_s": 41.7 if compiled else 0.0, "kernels": 9000, "kernel_ms": 300.0,
               "top_kernels": [{{"name": "gemm", "calls": 500, "ms": 200.0}}]}}, open(args[args.index("--json") + 1], "w"))
elif args[0].endswith("bench_decode_attention.py"):
    json.dump({{"device": "cuda", "results": [{{"batch": 1, "keys": 512, "way": "vlmfast", "us_p50": 13.8}},
                                             {{"batch": 1, "keys": 512, "way": "flex", "us_p50": 5.2}},
                                             {{"batch": 1, "keys": 512, "way": "sdpa-efficient", "error": "RuntimeError: no kernel"}}]}},
              open(args[args.index("--json") + 1], "w"))
elif args[0].endswith("bench_kernels.py"):
    json.dump({{"device": "cuda", "families": {{"qwen2_5_vl": {{"graph_breaks": 0, "generated_per_layer": 6.0,
                                                             "library_per_layer": 5.0}}}}}},
              open(args[args.index("--json") + 1], "w"))
elif args[:2] == ["-m", "pytest"]:
    print("12 passed in 80.00s")
elif args[:2] == ["-m", "vlmfast"]:
    command, rest = args[2], args[3:]
    opt = lambda name: rest[rest.index(name) + 1]
    if command == "make-checkpoint":
        os.makedirs(rest[0], exist_ok=True)
        open(os.path.join(rest[0], "vlmfast_tiny.json"), "w").write("{{}}")
    elif command == "make-images":
        os.makedirs(rest[0], exist_ok=True)
        for i in range(int(opt("-n"))):
            open(os.path.join(rest[0], f"img_{{i:03d}}.png"), "w").write("png")
    elif command == "bench":
        if os.environ.get("FAIL_MODE") and os.environ["FAIL_MODE"] in " ".join(rest):
            sys.exit("bench failed on purpose")
        report = _bench_report(opt("--ckpt"), 8 if opt("--batch-sizes") == "1" else 32,
                               [int(b) for b in opt("--batch-sizes").split(",")],
                               decoder=opt("--decoder") if "--decoder" in rest else "vlmfast", compile="--compile" in rest)
        report["notes"] = [f"VLMFAST_DECODE_ATTENTION={{os.environ.get('VLMFAST_DECODE_ATTENTION')}}"]
        os.makedirs(opt("--report"), exist_ok=True)
        open(os.path.join(opt("--report"), "report.json"), "w").write(json.dumps(report))
    elif command == "infer":
        print(json.dumps(_infer_report(opt("--ckpt"), 40.0, "miss", 1000.0)))
else:
    os.execv({python!r}, [{python!r}, *args])
"""


def _fake_python(tmp_path: Path) -> Path:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable, tests=str(Path(__file__).parent)))
    fake.chmod(0o755)
    return fake


def test_slices_run_steps_until_every_report_is_there(tmp_path):
    out, fake = tmp_path / "out", _fake_python(tmp_path)
    knobs = dict(PYTHON=fake, SIZES="3b", MODES="hf", SLICE_S="0")  # a slice of 0 s: one step per invocation
    codes = [gpu_sh(out, **knobs).returncode for _ in range(11)]
    # vision, build, hf-b1, hf-b32, infer, lengths, prefill, prefill-compiled, decode-attention, kernels, cuda-tests
    assert codes == [75] * 10 + [0]
    assert (out / "reports/qwen2.5-vl-3b-grpo-infer/second.json").exists() and (out / "images-8/img_007.png").exists()
    table = (out / "table.md").read_text()
    assert "### Fake GPU (CUDA 0.0)" in table
    assert [line.split(" | ")[1:4] for line in table.splitlines() if line.startswith("| qwen")] == [
        ["hf", "1", "8"], ["hf", "32", "32"], ["40.0", "40.0", "miss"], ["static batches", "2,000", "–"],
        ["continuous", "3,600", "1.80×"], ["eager", "32 (16+16)", "400.0"],
        ["compiled (42 s to compile)", "32 (16+16)", "300.0"], ["keys", "vlmfast", "flex"], ["0", "6", "5"]]
    assert "| static batches | 2,000 | – | 50% | – |" in table  # each mode's row utilization
    assert "| continuous | 3,600 | 1.80× | 80% | 32, 2.50 s, 2,000 |" in table  # and the continuous run's prefills
    assert "| qwen2.5-vl-3b-grpo | eager | 32 (16+16) | 400.0 | 250.0 | 140.0 | 10.0 | 9,000, 300.0 | gemm 200.0 |" in table
    assert "| 1 | 512 | 13.8 | 5.2 | failed (RuntimeError: no kernel) |" in table  # the attention candidates
    assert "tests/test_cuda.py on this machine: 12 passed in 80.00s" in table
    again = gpu_sh(out, **knobs)
    assert again.returncode == 0 and {action for action, _, _ in plan(again.stdout)} == {"skip"}  # nothing redone


def test_a_failed_step_stops_the_slice_and_keeps_the_table(tmp_path):
    out, fake = tmp_path / "out", _fake_python(tmp_path)
    r = gpu_sh(out, PYTHON=fake, SIZES="3b", MODES="default hf", FAIL_MODE="--decoder hf")
    assert r.returncode == 1 and "step(s) qwen2.5-vl-3b-grpo/hf-b1 failed" in r.stderr
    assert "bench failed on purpose" in r.stderr  # the step's log, shown
    assert "| default | 32 | 32 |" in (out / "table.md").read_text()  # the steps before it count
    assert not (out / "reports/qwen2.5-vl-3b-grpo-hf-b1/report.json").exists()
    assert not (out / "reports/qwen2.5-vl-3b-grpo-hf-b32/report.json").exists()  # the slice stopped there


def test_keep_going_runs_the_steps_after_a_failed_one(tmp_path):
    """KEEP_GOING=1, for a lease of one call: the failed step is named, the later steps still run."""
    out, fake = tmp_path / "out", _fake_python(tmp_path)
    r = gpu_sh(out, PYTHON=fake, SIZES="3b", MODES="default hf", FAIL_MODE="--decoder hf", KEEP_GOING="1")
    assert r.returncode == 1 and "step(s) qwen2.5-vl-3b-grpo/hf-b1 qwen2.5-vl-3b-grpo/hf-b32 failed" in r.stderr
    assert "hf-b1 failed; KEEP_GOING=1: on to the next step" in r.stderr
    assert (out / "reports/qwen2.5-vl-3b-grpo-kernels.json").exists() and (out / "reports/cuda-tests.txt").exists()


def _bench_report(ckpt: str, samples: int, batches: list[int], *, decoder="vlmfast", compile=False, tps=100.0) -> dict:
    """A report.json as `vlmfast bench --report` writes it (the keys the table reads, and some it does not)."""
    scenario = dict(runs=3, wall_s_median=1.0, ttft_ms_p90=60.0, tokens_per_s_p90=1.0, samples_per_s=1.0,
                    mean_new_tokens=128.0, mean_think_tokens=None, no_answer_rate=1.0, truncation_rate=1.0,
                    peak_mem_mib=9000.0, peak_mem_kind="cuda_max_allocated", step_ms=[], peak_gb_per_s=3350.0,
                    accuracy=None, format_rate=0.0, scored=0)
    return {
        "schema": "vlmfast.bench/2", "checkpoint": ckpt, "base": None,
        "workload": {"samples": samples, "max_new_tokens": 128, "ignore_eos": True, "decoder": decoder, "compile": compile,
                     "engines": ["hf"], "greedy": True, "batch_sizes": batches, "warmup": 1, "repeats": 3,
                     "with_ground_truth": 0},
        "cache": {}, "base_cache": None,
        "scenarios": [{**scenario, "name": "ckpt", "batch_size": b, "tokens_per_s": tps * b, "ttft_ms_p50": 50.0 + b,
                       "decode_ms_per_token": 10.0 + b / 100, "decode_gb_per_s": 600.0,
                       "bandwidth_pct_of_peak": 17.9 if decoder == "vlmfast" else None,
                       "ttft_vision_ms_p50": 30.0 if decoder == "vlmfast" else None,
                       "ttft_language_ms_p50": 20.0 + b if decoder == "vlmfast" else None} for b in batches],
        "ratios": {}, "accuracy": {}, "fidelity": {}, "first_difference": {}, "notes": [],
        "versions": {"vlmfast": "0.2.0", "torch": "2.11.0+cu130", "transformers": "5.23.0", "python": "3.11.9"},
    }


def _vision_report() -> dict:
    """What benchmarks/bench_vision.py --json writes."""
    ways = ("per-window", "merged", "merged+product")
    figures = lambda patches, calls, ms: {"patches": patches, "sdpa_calls": dict(zip(ways, calls)),
                                          "ms_runs": {}, "ms_median": dict(zip(ways, ms))}
    return {"preset": "3b", "device": "Fake GPU", "dtype": "bfloat16", "transformers": "5.23.0", "torch": "2.11.0",
            "workloads": {"mixed": figures(8052, (3952, 60, 60), (80.0, 20.0, 16.0)),
                          "same": figures(8192, (3616, 32, 32), (75.0, 30.0, 25.0))}}


def _infer_report(ckpt: str, compile_s: float, cache: str, tps: float) -> dict:
    """`vlmfast infer --json` output (the keys the table reads, and some it does not)."""
    return {"checkpoint": ckpt, "samples": 32, "compile_s": compile_s, "tokens_per_s": tps, "compiled": True,
            "compile_cache": {"dir": "/c", "compiles": [{"key": "k", "seconds": compile_s, "cache": cache}]},
            "versions": {"vlmfast": "0.2.0", "torch": "2.11.0+cu130", "transformers": "5.23.0", "python": "3.11.9"}}


def test_table_is_rebuilt_from_every_report_in_the_directory(tmp_path):
    out = tmp_path / "out"
    reports = {
        "qwen2.5-vl-7b-grpo-compile-b1": _bench_report("build/gpu-bench/ckpt/qwen2.5-vl-7b-grpo", 8, [1], compile=True, tps=110.0),
        "qwen2.5-vl-3b-grpo-hf-b1": _bench_report("build/gpu-bench/ckpt/qwen2.5-vl-3b-grpo", 8, [1], decoder="hf", tps=23.8),
        "qwen2.5-vl-3b-grpo-default-b8-32": _bench_report("build/gpu-bench/ckpt/qwen2.5-vl-3b-grpo", 32, [8, 32]),
        "qwen2.5-vl-3b-grpo-default-b1": _bench_report("build/gpu-bench/ckpt/qwen2.5-vl-3b-grpo", 8, [1], tps=120.5),
    }
    for name, report in reports.items():  # each written by a different slice
        _touch(out / "reports" / name / "report.json", json.dumps(report))
    (out / "reports/qwen2.5-vl-7b-grpo-hf-b1").mkdir()  # unfinished: no report.json
    infers = {"3b-grpo-infer/first": (41.2, "miss", 1500.0), "3b-grpo-infer/second": (7.9, "hit", 1650.4),
              "7b-grpo-infer/first": (50.0, "miss", 900.0)}  # the 7B's second run has not happened yet
    for where, figures in infers.items():
        ckpt = "/x/qwen2.5-vl-" + where.split("-infer")[0]
        _touch(out / f"reports/qwen2.5-vl-{where}.json", json.dumps(_infer_report(ckpt, *figures)))
    _touch(out / "device.json", json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "cuda": "13.0"}))
    _touch(out / "reports/vision.json", json.dumps(_vision_report()))

    r = subprocess.run([sys.executable, str(TABLE), str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "### NVIDIA H100 80GB HBM3 (CUDA 13.0) — transformers 5.23.0, torch 2.11.0+cu130"
    assert [line for line in lines if line.startswith("| qwen")] == [
        "| qwen2.5-vl-3b-grpo | default | 1 | 8 | 120.5 | 51.0 | 10.01 | 600 | 17.9 | 30.0 / 21.0 |",
        "| qwen2.5-vl-3b-grpo | default | 8 | 32 | 800.0 | 58.0 | 10.08 | 600 | 17.9 | 30.0 / 28.0 |",
        "| qwen2.5-vl-3b-grpo | default | 32 | 32 | 3200.0 | 82.0 | 10.32 | 600 | 17.9 | 30.0 / 52.0 |",
        "| qwen2.5-vl-3b-grpo | hf | 1 | 8 | 23.8 | 51.0 | 10.01 | 600 | – | – |",
        "| qwen2.5-vl-7b-grpo | compile | 1 | 8 | 110.0 | 51.0 | 10.01 | 600 | 17.9 | 30.0 / 21.0 |",
        "| qwen2.5-vl-3b-grpo | 41.2 | 7.9 | hit | 1650.4 |",  # the 7B infer has no second run yet
    ]
    assert [line for line in lines if line.startswith(("| mixed", "| same"))] == [
        "| mixed | 8052 | 80.0 | 3952 | 20.0 | 60 | 4.00× | 16.0 | 5.00× |",
        "| same | 8192 | 75.0 | 3616 | 30.0 | 32 | 2.50× | 25.0 | 3.00× |"]
    assert (out / "table.md").read_text() == r.stdout[:-1]  # print() adds a newline after the table's own


def test_a_compile_that_failed_is_not_labelled_compile(tmp_path):
    """bench records what ran (`compiled` per scenario): a compile that fell back is its own row label."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_table", TABLE)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    report = _bench_report("ckpt", 8, [1], compile=True)
    assert table.mode_of(report) == "compile"  # older reports, without the figure: as asked
    report["scenarios"][0]["compiled"] = True
    assert table.mode_of(report) == "compile"
    report["scenarios"][0]["compiled"] = False
    assert table.mode_of(report) == "compile failed (uncompiled)"


def test_a_whole_run_is_planned_only_when_asked_and_tabled_from_its_sweep(tmp_path):
    """RUN_SIZE adds one step, last: checkpoints of that shape built into a run directory and swept once;
    the table gives its wall time, sustained tokens/s and swap seconds from the sweep's own report."""
    out = tmp_path / "out"
    assert not [n for _, n, _ in plan(gpu_sh(out, "--dry-run", SIZES="3b").stdout) if n.startswith("run-")]
    r = gpu_sh(out, "--dry-run", SIZES="3b", RUN_SIZE="3b", RUN_CKPTS="4", RUN_PROMPTS="64", RUN_TOKENS="128")
    assert r.returncode == 0, r.stderr
    action, name, rest = plan(r.stdout)[-1]
    assert (action, name) == ("run", "run-3b-x4") and rest.endswith(f"whole_run 3b {out}/reports/run-3b")
    assert int(rest.split()[0].lstrip("~")) == 4 * 40 + 4 * 64 * 128 // 3000 + 60

    figures = [{"step": 100 * k, "tokens_per_s": 3000.0 + k, "swap_s": s} for k, s in ((1, None), (2, 0.8), (3, 1.2), (4, 0.9))]
    figures[0]["load_s"] = 9.0
    _touch(out / "reports/run-3b/sweep.json", json.dumps({"checkpoints": figures}))
    _touch(out / "reports/run-3b/wall.json", json.dumps({"wall_s": 120, "checkpoints": 4, "prompts": 64, "tokens": 128, "size": "3b"}))
    t = subprocess.run([sys.executable, str(TABLE), str(out)], capture_output=True, text=True, timeout=60)
    assert t.returncode == 0, t.stderr
    assert "| 3b | 4 | 64 × 128 | 2.0 | 273 | 0.90, 1.20 | 3003 |" in t.stdout.splitlines()  # 32,768 tokens in 120 s


def test_only_runs_the_steps_it_names(tmp_path):
    r = gpu_sh(tmp_path / "out", "--dry-run", SIZES="3b", ONLY="build|default")
    assert r.returncode == 0, r.stderr
    assert [n for a, n, _ in plan(r.stdout) if a == "run"] == [
        "qwen2.5-vl-3b-grpo/build", "qwen2.5-vl-3b-grpo/default-b1", "qwen2.5-vl-3b-grpo/default-b8-32"]
    assert "skip  qwen2.5-vl-3b-grpo/infer  (not in ONLY=build|default)" in r.stdout


def test_the_sdpa_attention_step_runs_with_its_variable_and_has_its_own_row(tmp_path):
    """PLAN=one in one call: the steps run in the plan's order, VLMFAST_DECODE_ATTENTION=sdpa reaches the
    compile-sdpa-b1 step's Python (and no other step's), and the table labels that row apart."""
    out, fake = tmp_path / "out", _fake_python(tmp_path)
    r = gpu_sh(out, PYTHON=fake, PLAN="one", SLICE_S="100000")
    assert r.returncode == 0, r.stderr
    ran = [line.split()[1] for line in r.stderr.splitlines() if line.startswith("[gpu.sh]") and "(estimate" in line]
    assert ran == [n for _, n, _ in plan(r.stdout)] and ran[4] == "qwen2.5-vl-3b-grpo/compile-sdpa-b1"
    notes = {d.name: json.loads((d / "report.json").read_text())["notes"] for d in (out / "reports").iterdir() if d.is_dir()}
    assert notes.pop("qwen2.5-vl-3b-grpo-compile-sdpa-b1") == ["VLMFAST_DECODE_ATTENTION=sdpa"]
    assert notes and all(n == ["VLMFAST_DECODE_ATTENTION=None"] for n in notes.values())
    assert [line.split(" | ")[1:3] for line in (out / "table.md").read_text().splitlines() if line.startswith("| qwen")][:4] == [
        ["default", "1"], ["default", "32"], ["compile", "1"], ["compile, SDPA attention", "1"]]


@pytest.fixture
def hung_step(tmp_path):
    """Starts gpu.sh with the step whose command holds env's HANG_MODE hanging (see FAKE_PYTHON); returns the
    script's process, the FIFO the step opens (read end, non-blocking) and, once the step runs, the pids of the
    hung Python and its child. Whatever of it is left at the end (a test that failed) is killed."""
    started = []

    def start(fake, **env):
        fifo = tmp_path / "hung"
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # before the step opens it: the step's open never blocks
        proc = subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env(tmp_path / "out", dict(PYTHON=fake, HANG_FIFO=fifo, **env)),
                                start_new_session=True)  # its own process group, not this test's
        started.append(proc.pid)
        pids = [int(pid) for pid in _read_fifo(fd, until_eof=False).split()]
        started.extend(pids)
        return proc, fd, pids

    yield start
    for pid in started:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if group != os.getpgrp():
            os.killpg(group, signal.SIGKILL)


def _read_fifo(fd: int, until_eof: bool) -> str:
    """A line from the hung step, or (until_eof) everything until no process holds the FIFO open: the step's
    Python and its child are both dead. 60 s without a word fails the test rather than hanging it."""
    data = b""
    while True:
        assert select.select([fd], [], [], 60)[0], f"the hung step's FIFO said nothing in 60 s: {data!r}"
        chunk = os.read(fd, 4096)
        if not chunk:
            return data.decode()
        data += chunk
        if not until_eof and data.endswith(b"\n"):
            return data.decode()


def test_a_step_past_its_limit_is_killed_with_its_children_and_the_next_step_runs(tmp_path, hung_step):
    """Each step runs under its own limit (STEP_LIMIT_S here: every step's): the hung step's process tree is
    killed, the step fails as past its limit, and with KEEP_GOING=1 the next step runs."""
    fake = _fake_python(tmp_path)
    proc, fd, _ = hung_step(fake, HANG_MODE="default-b1", SIZES="3b", MODES="default",
                                  ONLY="default", STEP_LIMIT_S="10", KEEP_GOING="1")
    assert _read_fifo(fd, until_eof=True) == ""  # both processes gone, killed at the limit
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "step(s) qwen2.5-vl-3b-grpo/default-b1 failed" in stderr, stderr
    assert "qwen2.5-vl-3b-grpo/default-b1 ran past its limit of 10 s: killed" in stderr
    assert (tmp_path / "out/reports/qwen2.5-vl-3b-grpo-default-b8-32/report.json").exists()  # the next step ran


def _delivered(remote: Path) -> set[str]:
    """What the device tool brings back of $OUT (at most 8 files, none deeper than $OUT/a/b/file), each
    file's path under $OUT/gpu-bench, reports.tar.gz's members among them."""
    import tarfile

    files = [p for p in remote.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.relative_to(remote).parts) <= 3 for p in files), files
    got = remote / "gpu-bench"
    names = {str(p.relative_to(got)) for p in files}
    if (got / "reports.tar.gz").exists():
        with tarfile.open(got / "reports.tar.gz") as tar:
            names |= {m.name for m in tar.getmembers() if m.isfile()}
    return names


def test_a_stopped_script_kills_its_step_and_delivers_to_OUT(tmp_path, hung_step):
    """SIGTERM (`timeout` around the script) mid-step: the step's processes are killed at once, the exit
    code is 143, and $OUT/gpu-bench holds the earlier steps' reports, the table of them and the stopped
    step's log."""
    fake, remote = _fake_python(tmp_path), tmp_path / "remote"
    proc, fd, _ = hung_step(fake, HANG_MODE="default-b8-32", SIZES="3b", MODES="default",
                                  ONLY="default", OUT=remote)
    proc.send_signal(signal.SIGTERM)
    assert _read_fifo(fd, until_eof=True) == ""
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "stopped by SIGTERM: ending the running step" in stderr, stderr
    got, names = remote / "gpu-bench", _delivered(remote)
    assert {"reports/qwen2.5-vl-3b-grpo-default-b1/report.json", "device.json"} <= names
    assert "reports/qwen2.5-vl-3b-grpo-default-b8-32.log" in names
    assert "| qwen2.5-vl-3b-grpo | default | 1 | 8 |" in (got / "table.md").read_text()


def test_results_reach_OUT_after_every_step_even_when_the_script_is_killed(tmp_path, hung_step):
    """SIGKILL (the call's own end) leaves no trap to run: what $OUT holds was copied after each step — the
    finished steps' reports and the table rebuilt from them."""
    fake, remote = _fake_python(tmp_path), tmp_path / "remote"
    proc, fd, (hung, _) = hung_step(fake, HANG_MODE="default-b8-32", SIZES="3b", MODES="default",
                                          ONLY="build|default", OUT=remote)
    proc.kill()
    proc.communicate(timeout=60)
    os.killpg(os.getpgid(hung), signal.SIGKILL)  # the step's own process group outlives a killed script
    assert _read_fifo(fd, until_eof=True) == ""
    got = remote / "gpu-bench"
    assert "reports/qwen2.5-vl-3b-grpo-default-b1/report.json" in _delivered(remote)
    assert "| qwen2.5-vl-3b-grpo | default | 1 | 8 |" in (got / "table.md").read_text()


def test_only_small_results_are_copied_to_OUT(tmp_path):
    """$OUT/gpu-bench gets reports' .json, .txt, .log and .part files under 5 MB (in reports.tar.gz: the tool
    brings back 8 files, 2 folders down), device.json and table.md: no
    checkpoint, image, compile cache or large file; RESULTS.md only when the script writes it. Nothing is
    copied without OUT, or where OUT is OUT_DIR itself."""
    out, fake, remote = tmp_path / "out", _fake_python(tmp_path), tmp_path / "remote"
    _touch(out / "reports/qwen2.5-vl-3b-grpo-infer/cache/kernel.json")  # a compile cache
    _touch(out / "reports/run-3b/run/checkpoint-100/config.json")  # a whole run's checkpoint
    _touch(out / "reports/run-3b/sweep.json")
    _touch(out / "reports/plot.png", "png")
    _touch(out / "reports/huge.log", "x" * (6 << 20))
    r = gpu_sh(out, PYTHON=fake, PLAN="one", SLICE_S="100000", OUT=remote)
    assert r.returncode == 0, r.stderr
    got = remote / "gpu-bench"
    copied = sorted(_delivered(remote))
    assert "reports/qwen2.5-vl-3b-grpo-compile-sdpa-b1/report.json" in copied and "reports/cuda-tests.txt" in copied
    assert {"device.json", "table.md", "reports/run-3b/sweep.json", "reports/cuda-tests.log"} <= set(copied)
    assert not [p for p in copied if p.endswith((".png", "huge.log", "RESULTS.md")) or "cache" in p or "checkpoint" in p]
    assert (got / "table.md").read_text() == (out / "table.md").read_text()
    assert not (out / "gpu-bench").exists() and gpu_sh(out, PYTHON=fake, PLAN="one", OUT=out).returncode == 0
    assert not (out / "gpu-bench").exists()  # OUT is OUT_DIR: the results are there already
