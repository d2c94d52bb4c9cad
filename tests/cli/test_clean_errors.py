"""Output places, settings and datasets that cannot work are one `error:` line with a hint and exit 2,
before any model loads or any work is done: never a traceback, never after the work."""

from __future__ import annotations

import json
import shutil

from conftest import cli


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sweep_out_dir_that_is_a_file_or_unwritable_is_a_clear_error(grpo_ckpt, images, tmp_path):
    manifest = _jsonl(tmp_path / "m.jsonl", [{"id": "a", "image": str(images[0]), "prompt": "p", "solution": "1"}])
    taken = tmp_path / "taken"
    taken.write_text("x")
    r = cli("sweep", grpo_ckpt.parent, "--manifest", manifest, "--out-dir", taken)
    assert r.returncode == 2 and f"--out-dir {taken}: is a file" in r.stderr and "hint:" in r.stderr
    r = cli("sweep", grpo_ckpt.parent, "--manifest", manifest, "--out-dir", "/sys/vlmfast-sweep")
    assert r.returncode == 2 and "--out-dir /sys/vlmfast-sweep: cannot write in /sys" in r.stderr


def test_bench_report_that_is_a_file_is_refused_before_the_bench_runs(grpo_ckpt, tmp_path, monkeypatch):
    import vlmfast.run.bench as bench

    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: (_ for _ in ()).throw(AssertionError("the bench ran")))
    taken = tmp_path / "report"
    taken.write_text("x")
    r = cli("bench", "--ckpt", grpo_ckpt, "--synthetic", 1, "--report", taken)
    assert r.returncode == 2 and f"--report {taken}: is a file" in r.stderr


def test_infer_out_that_cannot_be_written_is_refused_before_loading(grpo_ckpt, images, monkeypatch):
    import vlmfast.engines.open as engines

    monkeypatch.setattr(engines, "open_backend", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--out", "/sys/vlmfast/res.jsonl")
    assert r.returncode == 2 and "--out /sys/vlmfast/res.jsonl: cannot write in /sys" in r.stderr


def test_reward_kwargs_not_json_with_a_training_record_beside_the_checkpoint(grpo_ckpt, images, tmp_path):
    ckpt = shutil.copytree(grpo_ckpt, tmp_path / "checkpoint-10")
    (ckpt / "args.json").write_text(json.dumps({"rlhf_type": "grpo", "temperature": 0.9}))
    reward = tmp_path / "r.py"
    reward.write_text("def f(completions, solution, **kwargs):\n    return [1.0 for _ in completions]\n")
    r = cli("infer", "--ckpt", ckpt, "--images", images[0], "--prompt", "p", "--reward", f"{reward}:f",
            "--reward-kwargs", "{format_weight: 0.1}")
    assert r.returncode == 2 and "--reward-kwargs: not JSON" in r.stderr and "hint:" in r.stderr


def test_a_broken_parquet_manifest_is_a_clear_error(grpo_ckpt, tmp_path):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not a parquet file")
    r = cli("infer", "--ckpt", grpo_ckpt, "--manifest", broken)
    assert r.returncode == 2 and f"cannot read {broken}" in r.stderr and "hint:" in r.stderr


def test_a_broken_config_json_is_named_not_the_processor(grpo_ckpt, images, tmp_path):
    from vlmfast.checkpoints.load import load
    from vlmfast.errors import CheckpointError

    ckpt = shutil.copytree(grpo_ckpt, tmp_path / "ckpt")
    (ckpt / "config.json").write_text('{"model_type": "qwen2_5_vl",')  # a save cut short
    r = cli("infer", "--ckpt", ckpt, "--images", images[0], "--prompt", "p")
    assert r.returncode == 2 and f"{ckpt / 'config.json'}: cannot read" in r.stderr
    assert "processor" not in r.stderr
    try:
        load(str(ckpt), device="cpu")
    except CheckpointError as exc:
        assert "config.json: cannot read" in exc.message and "processor" not in (exc.hint or "")
    else:
        raise AssertionError("a broken config.json loaded")


def test_cut_weights_and_a_broken_config_are_said_before_torch_is_imported(grpo_ckpt, images, tmp_path):
    """What the files alone show (a safetensors file shorter than its header says, a config.json cut short)
    fails before torch is imported: in a second, not after the 8–9 s torch takes to load."""
    import subprocess
    import sys

    ckpt = shutil.copytree(grpo_ckpt, tmp_path / "ckpt")
    weights = next(ckpt.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    probe = ("import runpy, sys\nsys.argv = ['vlmfast', 'infer', '--ckpt', sys.argv[1], '--images', sys.argv[2], '--prompt', 'p']\n"
             "try:\n    runpy.run_module('vlmfast', run_name='__main__')\nexcept SystemExit as exc:\n"
             "    print(exc.code, 'torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", probe, str(ckpt), str(images[0])], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False"], r.stderr
    assert "the weights are incomplete" in r.stderr and "hint:" in r.stderr
    (ckpt / "config.json").write_text("{")
    r = subprocess.run([sys.executable, "-c", probe, str(ckpt), str(images[0])], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False"] and "config.json: cannot read" in r.stderr


def test_with_json_an_error_is_json_on_stdout_too(grpo_ckpt, images, tmp_path):
    """A script reading --json's stdout gets an object whatever the exit code: the error's message, hint,
    problems and exit code (stderr says it for people)."""
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", tmp_path / "gone.png", "--prompt", "Q?", "--out",
            tmp_path / "r.jsonl", "--json")
    error = json.loads(r.stdout)["error"]
    assert r.returncode == error["exit_code"] == 2 and "error: 1 bad input" in r.stderr
    assert error["problems"] == [f"{tmp_path / 'gone.png'}: file not found"] and error["hint"]
    r = cli("score", tmp_path / "none.jsonl", "--manifest", tmp_path / "none.jsonl", "--json")
    assert r.returncode == json.loads(r.stdout)["error"]["exit_code"] != 0


def test_out_dash_means_stdout(grpo_ckpt, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "Q?", "--max-new-tokens", 2, "--out", "-")
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[0])["id"] == str(images[0])
    assert not list(tmp_path.iterdir())  # no file named "-", no "-.run.json"


def test_make_images_into_a_file_or_of_no_images_is_a_clear_error(tmp_path):
    taken = tmp_path / "taken.png"
    taken.write_text("x")
    r = cli("make-images", taken, "-n", 2)  # mkdir's FileExistsError was a traceback
    assert r.returncode == 2 and f"make-images {taken}: is a file" in r.stderr and "hint:" in r.stderr
    for args, said in ((("-n", 0), "-n 0: expected 1 to 100,000 images"), (("--size", 0), "--size 0: expected a side"),
                       (("-n", 10**9), "-n 1000000000: expected 1 to"), (("--size", 10**6), "--size 1000000: expected a side of 1 to 8192")):
        r = cli("make-images", tmp_path / "imgs", *args)
        assert r.returncode == 2 and said in r.stderr and not (tmp_path / "imgs").exists()
    r = cli("make-images", tmp_path / "imgs", "-n", 2, "--size", 32)
    assert r.returncode == 0 and len(list((tmp_path / "imgs").glob("*.png"))) == 2


def test_sweep_help_names_no_option_it_lacks():
    sweep = cli("sweep", "--help").stdout
    assert "--images" not in sweep  # its --prompt and --prompt-file are for manifest records without a prompt
    assert "report.html" in sweep
    bench = cli("bench", "--help").stdout
    assert "--match-training" not in bench  # --resize-rule's help named it; bench has none
