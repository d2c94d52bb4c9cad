"""Shared fixtures and helpers: one tiny GRPO-like and one base-like checkpoint per session, sample
images, trainer layouts, and two ways to drive the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

VLMFAST = Path(sys.executable).parent / "vlmfast"


def pytest_configure(config):
    config.addinivalue_line("markers", "transformers_independent: tests of code that never imports transformers "
                            "(a shell script and its fake Python): run under transformers 5 only, not again under 4.57")
    config.addinivalue_line("markers", "torch_mechanism: tests of a torch mechanism that no transformers line changes "
                            "(inductor's on-disk cache found by a second process): run under transformers 5 only; the "
                            "compiled step itself is tested under both")
    config.addinivalue_line("markers", "process_mechanism: tests of what processes do (signals and resume, launched "
                            "processes, a script's exit-code gates, a log's formatting), the same under every "
                            "transformers: run under transformers 5 only; the same runs' models under 4.57 are tested by "
                            "the rest of the suite")


# The slowest modules run first, the slowest first (their test time under transformers 5 on 2 cores, measured with
# --durations, in brackets): two xdist workers that drew them last left one core idle for the last ~3 minutes.
SLOW_FIRST = (
    "tests/engines/hf/test_compile_policy.py",  # 250 s (a cold compile in a subprocess, then a second process)
    "tests/run/test_bench.py",  # 155
    "tests/run/test_trainer_flows.py",  # 99
    "tests/run/test_faults.py",  # 95
    "tests/test_gpu_script.py",  # 86
    "tests/run/test_parallel.py",  # 86
    "tests/run/test_sweep.py",  # 70
    "tests/engines/hf/test_step_kernels.py",  # 68
    "tests/cli/test_cli.py",  # 67
    "tests/checkpoints/test_weights.py",  # 50
    "tests/engines/hf/test_engine.py",  # 43
    "tests/cli/test_ci_check.py",  # 40
    "tests/engines/hf/test_vision_compile.py",  # 31
)


def pytest_collection_modifyitems(config, items):
    from importlib.metadata import version

    rank = {module: i for i, module in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the others keep their order
    if int(version("transformers").split(".")[0]) >= 5:
        return
    skip = pytest.mark.skip(reason="touches no transformers code: run under transformers 5")
    torch_only = pytest.mark.skip(reason="a torch mechanism, the same under every transformers: run under transformers 5")
    process_only = pytest.mark.skip(reason="what processes do, the same under every transformers: run under transformers 5")
    for item in items:
        if item.get_closest_marker("transformers_independent"):
            item.add_marker(skip)
        elif item.get_closest_marker("torch_mechanism"):
            item.add_marker(torch_only)
        elif item.get_closest_marker("process_mechanism"):
            item.add_marker(process_only)


def vlmfast(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """The installed console script in a subprocess, as CI shell scripts call it: for what only a
    process proves (exit codes with signals, stdout kept clean, what gets imported, the launcher).
    It runs on the CPU whatever the machine has: tests assert exact tokens and float32 figures."""
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([str(VLMFAST), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(*args) -> CliResult:
    """The same Typer app called in this process (no interpreter start-up, torch imported once).
    An exception the CLI did not turn into an exit code is re-raised: a traceback is a failure."""
    from typer.testing import CliRunner

    from vlmfast.cli import app, spread_multi_value

    result = CliRunner().invoke(app, spread_multi_value([str(a) for a in args]), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


@pytest.fixture(scope="session", autouse=True)
def own_compile_cache(tmp_path_factory):
    """Compiled kernels and step timings go to a temporary cache, never the machine's own (subprocesses
    inherit the variable)."""
    os.environ["VLMFAST_CACHE"] = str(tmp_path_factory.getbasetemp() / "vlmfast-cache")


@pytest.fixture(autouse=True)
def pillow_pixel_limit():
    """Collecting inputs sets Pillow's process-wide pixel limit to the run's --max-image-pixels (so decoding
    agrees with the check); a test that collects with a small limit must not leave it to the next test."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    yield
    Image.MAX_IMAGE_PIXELS = limit


@pytest.fixture(scope="session")
def family_ckpts(tmp_path_factory):
    """Each family's tiny GRPO-like checkpoint, built once per session, on demand (read only: copy to change)."""
    from vlmfast.checkpoints.tiny import build_checkpoint

    root, built = tmp_path_factory.mktemp("families"), {}

    def get(key):
        if key not in built:
            built[key] = build_checkpoint(root / key, family=key)
        return built[key]
    return get


@pytest.fixture(scope="module")
def family_loaded(family_ckpts):
    """Each family's tiny checkpoint loaded on the CPU, once per test module, on demand."""
    from vlmfast.checkpoints.load import load

    cache = {}

    def get(key):
        if key not in cache:
            cache[key] = load(str(family_ckpts(key)), device="cpu")
        return cache[key]
    return get


@pytest.fixture(scope="session")
def grpo_ckpt(tmp_path_factory) -> Path:
    from vlmfast.checkpoints.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "grpo", preset="tiny", like="grpo")


@pytest.fixture(scope="session")
def base_ckpt(tmp_path_factory) -> Path:
    from vlmfast.checkpoints.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "base", preset="tiny", like="base")


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> list[Path]:
    from vlmfast.checkpoints.tiny import make_images

    return make_images(tmp_path_factory.mktemp("images"), n=6)


@pytest.fixture(scope="session")
def loaded(grpo_ckpt):
    """The GRPO-like checkpoint loaded by vlmfast (cache forced on), on the CPU in float32 whatever
    the machine has: tests compare tokens exactly. Read-only for tests."""
    from vlmfast.checkpoints.load import load

    return load(str(grpo_ckpt), device="cpu")


@pytest.fixture(scope="session")
def layouts(tmp_path_factory):
    """Every trainer output layout around tiny checkpoints, built once per session."""
    from layouts import LAYOUTS, build_layout

    root = tmp_path_factory.getbasetemp() / "layouts"
    return {like: build_layout(root / like, like) for like in LAYOUTS}


def model_inputs(engine, requests):
    """One prefill group's model inputs for ``requests`` on the engine's device (the reference for
    plain ``generate``)."""
    images, failed = engine.load_images(requests)
    assert not failed, failed
    return engine.on_device(engine.build_inputs(requests, images))


def generate_tokens(loaded, inputs, max_new: int, eos) -> list[list[int]]:
    """Plain transformers greedy generate with the cache on: the reference every vlmfast path is held to.
    Each row's new tokens, cut after its first EOS (kept, as generate keeps it)."""
    import torch

    n = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        out = loaded.model.generate(**inputs, use_cache=True, max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=eos or None, pad_token_id=loaded.pad_token_id,
                                    suppress_tokens=loaded.suppress_token_ids or None)
    return [row[:next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in out[:, n:].tolist()]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data, indent=2))


def retrain_adapter(adapter_file: Path) -> None:
    """A LoRA adapter's weights changed as a further training step changes them (every lora_B negated), shapes
    kept: what a trainer saving over the adapter file leaves."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(adapter_file))
    save_file({k: -v if "lora_B" in k else v for k, v in state.items()}, str(adapter_file), metadata={"format": "pt"})


class FakeBackend:
    """A :class:`vlmfast.engines.contract.Backend` without a model: every request answers ``answers[id]`` (default
    "A") as ``<think>…</think><answer>…</answer>`` in ``tokens`` new tokens. Runner, summary and report
    logic run through it in milliseconds, without torch. ``fail_at``: the batch index that raises."""

    device = "cpu"

    def __init__(self, answers=None, tokens=4, fail_at=None, interrupt_at=None, max_pixels=1003520, capped=False,
                 too_long=()):
        self.answers, self.tokens, self.fail_at, self.too_long = answers or {}, tokens, fail_at, set(too_long)
        self.interrupt_at = interrupt_at
        self.max_pixels, self.capped = max_pixels, capped
        self.batches_run, self.closed = 0, False

    def context_problems(self, requests, image_sizes):
        return {r.id: "prompt is too long (fake)" for r in requests if r.id in self.too_long}

    def ready(self, requests, image_sizes, requested):
        return requested or 2, None if requested else "batch size auto: 2 (fake)"

    def plan(self, requests, image_sizes, batch_size):
        return [list(range(i, min(i + batch_size, len(requests)))) for i in range(0, len(requests), batch_size)]

    def batches(self, requests, image_sizes, planned):
        from vlmfast.engines.rows import BatchTiming, SampleResult

        for k, indices in enumerate(planned):
            if k == self.fail_at:
                raise RuntimeError(f"fake failure in batch {k}")
            if k == self.interrupt_at:
                raise KeyboardInterrupt
            rows = []
            for i in indices:
                r = requests[i]
                answer = self.answers.get(r.id, "A")
                rows.append(SampleResult(r.id, list(r.images), r.prompt, text=f"<think>t</think><answer>{answer}</answer>",
                                         think="t", answer=answer, finish_reason="eos", n_prompt_tokens=10,
                                         n_new_tokens=self.tokens, token_ids=[1] * self.tokens,
                                         image_sizes=[list(s) for s in r.image_sizes] if r.image_sizes else None))
            self.batches_run += 1
            yield [(indices, rows, BatchTiming(size=len(rows), preprocess_s=0.01, ttft_s=0.02, decode_s=0.03,
                                               steps=self.tokens, new_tokens=self.tokens * len(rows)))]

    def switch_to(self, found, canary=None):
        from vlmfast.engines.contract import Switched

        return Switched.impossible("the fake backend opens once per checkpoint")

    def news(self):
        return {}, []

    def facts(self):
        from vlmfast.engines.facts import EngineFacts

        return EngineFacts(engine="hf", checkpoint="fake", load_s=0.5, cache={"found_off": [], "saved_enabled": True,
                           "forced_on": True}, device="cpu", dtype="float32", attn="sdpa", decoder="vlmfast",
                           cuda_graphs=False, compiled=False, max_pixels=self.max_pixels, max_pixels_capped=self.capped)

    def close(self):
        self.closed = True
