"""The CLI end to end: through the installed console script where the process matters (exit codes,
stdout holding exactly one JSON object), in-process otherwise."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import VLMFAST, cli, read_jsonl, vlmfast


def test_console_script_is_installed_and_help_lists_exit_codes():
    assert VLMFAST.is_file(), "install the package (pip install -e .) so the vlmfast console script exists"
    r = vlmfast("--help")
    assert r.returncode == 0 and "infer" in r.stdout and "Exit codes" in r.stdout
    v = subprocess.run([sys.executable, "-m", "vlmfast", "--version"], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.startswith("vlmfast ")


def test_infer_json_report_and_jsonl_results(grpo_ckpt, images, tmp_path):
    out = tmp_path / "res.jsonl"
    d = images[0].parent
    r = vlmfast("infer", "--ckpt", grpo_ckpt, "--images", d, "--prompt", "Count the shapes.", "--template", "r1",
                "--max-new-tokens", 12, "--batch-size", 4, "--out", out, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # stdout holds exactly one JSON object
    for key in ("samples", "new_tokens", "load_s", "preprocess_s", "generate_s", "prefill_s", "vision_s", "ttft_ms_p50",
                "ttft_ms_p90", "decode_ms_per_token", "tokens_per_s", "samples_per_s", "peak_mem_mib", "dtype", "attn",
                "decoder", "cuda_graphs", "compiled", "device_syncs", "batch_size", "scores", "versions"):
        assert key in report, key
    assert report["samples"] == 6 and report["errors"] == 0 and report["batching"] == "continuous"
    assert 2 <= report["batches"] <= 6  # admissions: 4 rows first, then requests into rows as they free
    assert 0 < report["decode_row_utilization"] <= 1
    assert report["cache"]["forced_on"] is True and len(report["cache"]["found_off"]) == 3
    assert (report["dtype"], report["attn"], report["device"]) == ("float32", "sdpa", "cpu")
    assert (report["decoder"], report["cuda_graphs"], report["compiled"]) == ("vlmfast", False, False)
    assert report["decode_gb_per_s"] > 0 and report["bandwidth_pct_of_peak"] is None  # no datasheet peak for a CPU
    if report["decode_gb_per_s"] < 1:  # the tiny model reads megabytes a step: said in MB/s, not "0.0 GB/s"
        assert f"{report['decode_gb_per_s'] * 1000:,.0f} MB/s read" in r.stderr, r.stderr
    assert 0 < report["vision_s"] < report["prefill_s"]
    assert report["cache_fill_s"] > 0  # the prefill caches copied into the decode rows, apart from prefill and decode
    rows = read_jsonl(out)
    assert [row["id"] for row in rows] == [str(d / f"img_{i:03d}.png") for i in range(6)]  # input order
    assert set(rows[0]) == {"id", "images", "prompt", "text", "think", "answer", "finish_reason", "n_prompt_tokens",
                            "n_image_tokens", "n_new_tokens", "error", "image_sizes", "model_image_sizes", "image_grid_thw",
                            "bbox_space", "score", "correct", "format_ok", "scorer", "iou", "parse_failed", "bbox_unmapped"}
    assert rows[0]["bbox_space"] == "resized"  # Qwen2.5-VL answers boxes in the resized image's pixels
    assert all(row["error"] is None and 1 <= row["n_new_tokens"] <= 12 for row in rows)
    assert rows[0]["image_sizes"] == [[56, 56]] and rows[0]["score"] is None and rows[0]["format_ok"] is False
    assert rows[0]["prompt"].endswith("in <answer> </answer> tags.")
    assert report["new_tokens"] == sum(row["n_new_tokens"] for row in rows)
    assert report["scores"]["scored"] == 0 and report["scores"]["format_rate"] == 0.0
    assert "forced on" in r.stderr  # the human report went to stderr
    health = report["scores"]["health"]  # the answers' shape, and its line in the human report
    assert health["new_tokens_max"] == max(row["n_new_tokens"] for row in rows)
    assert health["truncation_rate"] == round(sum(row["finish_reason"] == "length" for row in rows) / 6, 4)
    assert f"max {health['new_tokens_max']} tokens · truncated" in r.stderr

    # rerun: every id is already there, nothing is regenerated
    again = vlmfast("infer", "--ckpt", grpo_ckpt, "--images", d, "--prompt", "Count the shapes.", "--template", "r1",
                    "--max-new-tokens", 12, "--out", out, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["skipped_existing"] == 6 and json.loads(again.stdout)["samples"] == 0
    assert "nothing to do: 6 row(s) already in" in again.stderr and "tokens/s" not in again.stderr
    assert read_jsonl(out) == rows


def test_bad_inputs_exit_2_and_write_nothing(grpo_ckpt, images, tmp_path):
    out = tmp_path / "res.jsonl"
    bad = tmp_path / "broken.png"
    bad.write_text("not an image")
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], tmp_path / "gone.png", bad, "--prompt", "p", "--out", out)
    assert r.returncode == 2
    assert "gone.png: file not found" in r.stderr and "broken.png: not a readable image" in r.stderr
    assert "--skip-bad" in r.stderr and not out.exists()

    skip = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], tmp_path / "gone.png", bad,
               "--prompt", "p", "--out", out, "--skip-bad", "--max-new-tokens", 4, "--device", "cpu")
    assert skip.returncode == 0, skip.stderr
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert rows[str(images[0])]["error"] is None and rows[str(images[0])]["n_new_tokens"] >= 1
    assert "file not found" in rows[str(tmp_path / "gone.png")]["error"]
    assert rows[str(bad)]["error"].startswith(f"{bad}: not a readable image") and rows[str(bad)]["text"] is None


def test_usage_errors_are_clear(grpo_ckpt, images, tmp_path):
    r = vlmfast("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--json")
    assert r.returncode == 2 and "add --out" in r.stderr and json.loads(r.stdout)["error"]["hint"] == "add --out results.jsonl"
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--attn", "flash_attention_2",
            "--device", "cpu")
    assert r.returncode == 2 and "needs a CUDA device" in r.stderr
    r = cli("infer", "--ckpt", tmp_path / "nope", "--images", images[0], "--prompt", "p")
    assert r.returncode == 2 and "no such directory" in r.stderr
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--decoder", "fast")
    assert r.returncode == 2 and "--decoder fast: unknown" in r.stderr and "vlmfast, hf" in r.stderr
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--decoder", "hf", "--compile",
            "--device", "cpu")
    assert r.returncode == 2 and "plain generate" in r.stderr


def test_make_checkpoint_and_results_to_stdout(tmp_path, images):
    r = cli("make-checkpoint", tmp_path / "b", "--like", "base")
    assert r.returncode == 0, r.stderr
    ckpt = Path(r.stdout.strip())
    assert "use_cache" not in json.loads((ckpt / "generation_config.json").read_text())
    r = cli("infer", "--ckpt", ckpt, "--images", images[2], images[0], "--prompt", "p", "--max-new-tokens", 3,
            "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["id"] for line in r.stdout.splitlines()] == [str(images[2]), str(images[0])]


def test_images_takes_a_list_after_one_flag():
    from vlmfast.cli import spread_multi_value

    assert spread_multi_value(["infer", "--images", "a", "b", "--prompt", "p", "--images=c", "d"]) == [
        "infer", "--images", "a", "--images", "b", "--prompt", "p", "--images=c", "--images", "d"]


def test_help_reads_as_people_write_it():
    doctor = cli("doctor", "--help")
    assert "vlmfast doctor [OPTIONS] CKPT" in doctor.stdout and "{ckpt}" not in doctor.stdout
    infer = cli("infer", "--help")
    assert "<bool>" not in infer.stdout and "--cuda-graphs" in infer.stdout and "--decoder" in infer.stdout
    images = cli("make-images", "--help")
    assert "--count" in images.stdout and "--n " not in images.stdout


def test_text_on_screen_is_shown_as_written(capsys):
    from vlmfast.checkpoints.doctor import Finding
    from vlmfast.errors import UsageError
    from vlmfast.report.terminal import render_error, render_findings, render_note, stderr

    with stderr.capture() as captured:
        render_note("flash-attn is not installed: pip install 'vlmfast[gpu]'")
        render_error(UsageError("bad [bold]thing[/bold]", hint="pip install 'vlmfast[plot]'"))
        render_findings("ckpt[1]", [Finding("error", "cache-off", "a", "m", "f"),
                                    *[Finding("warning", "cache-off", "b", "m[x]", "f")] * 2])
    text = captured.get()
    assert "'vlmfast[gpu]'" in text and "'vlmfast[plot]'" in text and "[bold]thing[/bold]" in text
    assert "ckpt[1]" in text and "m[x]" in text
    assert "1 error, 2 warnings" in text


def test_demo_runs_offline_and_reports_the_as_saved_comparison(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "notes.txt").write_text("not an image")  # a stray file: the demo runs the images it wrote
    r = vlmfast("demo", "--workdir", tmp_path, "--max-new-tokens", 4)
    assert r.returncode == 0, r.stderr
    assert "forced on" in r.stderr and "identical greedy tokens for 8/8 samples" in r.stderr
    assert "one timed run each: the speed-up moves with what else the machine runs" in r.stderr
    assert "--compare-base" in r.stderr and "--like base" in r.stderr  # the suggested next step has a base
    assert len(read_jsonl(tmp_path / "results.jsonl")) == 8


def test_demo_refuses_its_options_before_building_anything(tmp_path):
    for flag, value in (("--batch-size", 0), ("--max-new-tokens", 0)):
        r = cli("demo", "--workdir", tmp_path / "d", flag, value)
        assert r.returncode == 2 and f"{flag} 0" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "d").exists()  # exit 2: nothing written (the build took ~30 s before its options failed)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_engine_vllm_without_vllm_is_a_clear_error(grpo_ckpt, images):
    r = cli("infer", "--engine", "vllm", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p")
    assert r.returncode == 2 and "not installed" in r.stderr and "pip install 'vlmfast[vllm]'" in r.stderr


def test_options_of_the_other_engine_are_refused(grpo_ckpt, images):
    r = cli("infer", "--engine", "vllm", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--compile",
            "--attn", "sdpa")
    assert r.returncode == 2 and "--attn, --compile apply to vlmfast's own engine (--engine hf)" in r.stderr
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--tensor-parallel-size", 2)
    assert r.returncode == 2 and "error: --tensor-parallel-size applies to --engine vllm" in r.stderr
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--pipeline-parallel-size", 2,
            "--distributed-executor-backend", "ray")  # the flags given are named, not a fixed list of others
    assert r.returncode == 2 and "--pipeline-parallel-size, --distributed-executor-backend apply to --engine vllm" in r.stderr


def test_suggested_commands_name_a_vlmfast_the_shell_finds(monkeypatch):
    """scripts/demo.sh never activates .venv: its suggestions must not call a bare `vlmfast` off PATH."""
    import os
    import shutil

    from vlmfast.cli.demo import console_script

    monkeypatch.setattr(shutil, "which", lambda name: None)  # not on PATH
    command = console_script()
    assert command != "vlmfast" and os.access(command, os.X_OK)
    monkeypatch.setattr(shutil, "which", lambda name: str(VLMFAST))  # on PATH: the short name
    assert console_script() == "vlmfast"


@pytest.mark.parametrize("command", ["infer", "score", "convert"])
def test_out_that_is_a_directory_is_a_clear_error(command, grpo_ckpt, images, tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text('{"id": "a", "text": "x"}\n')
    args = {"infer": ["--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p"],
            "score": [results, "--manifest", results], "convert": [results]}[command]
    r = cli(command, *args, "--out", tmp_path)
    assert r.returncode == 2 and f"--out {tmp_path}: is a directory" in r.stderr and "results.jsonl" in r.stderr


def test_tables_in_a_log_keep_every_number_on_its_line(tmp_path):
    """Not on a terminal (CI logs), tables render 200 columns wide rather than rich's 80: a wide table is not
    wrapped or cut."""
    import subprocess
    import sys

    code = ("from rich.table import Table\nfrom vlmfast.report.terminal import stderr\n"
            "t = Table()\n[t.add_column(f'column {i}') for i in range(8)]\n"
            "t.add_row(*[f'{i}.12 % (0.10–0.90)' for i in range(8)])\nstderr.print(t)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    row = next(line for line in r.stderr.splitlines() if "0.12 %" in line)
    assert all(f"{i}.12 % (0.10–0.90)" in row for i in range(8)), r.stderr


def test_with_json_a_command_line_click_refuses_is_one_json_error_and_exit_codes_pass_through(tmp_path):
    """CI scripts read stdout as JSON whatever happened: an unknown option, a bad value or a missing one is
    the same error object as vlmfast's own errors (exit 2); a command's own exit code reaches the shell."""
    for args, words in ((("infer", "--bogus"), "No such option: --bogus"),
                        (("infer", "--ckpt", "x", "--max-new-tokens", "abc"), "Invalid value for '--max-new-tokens'"),
                        (("infer",), "Missing option '--ckpt'")):
        r = vlmfast(*args, "--json")
        assert r.returncode == 2 and words in json.loads(r.stdout)["error"]["message"], (args, r.stdout, r.stderr)
        assert words in r.stderr
    r = vlmfast("score", tmp_path / "none.jsonl", "--manifest", tmp_path / "m.jsonl", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["exit_code"] == 2
    manifest, results = tmp_path / "m.jsonl", tmp_path / "r.jsonl"
    manifest.write_text(json.dumps({"id": "a", "image": "x.png", "prompt": "Q", "solution": "1"}) + "\n")
    results.write_text(json.dumps({"id": "a", "text": "<answer>1</answer>"}) + "\n")
    r = vlmfast("score", results, "--manifest", manifest, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["accuracy"] == 1.0
    r = vlmfast("score", results, "--manifest", manifest, "--iou", "2", "--json")  # no box could count as correct
    assert r.returncode == 2 and "--iou 2.0: expected a value in [0, 1]" in json.loads(r.stdout)["error"]["message"]
    r = vlmfast("infer", "--help", "--json")
    assert r.returncode == 0 and "Usage: vlmfast infer" in r.stdout


def test_an_interrupt_while_a_finished_report_is_written_waits_for_it_and_keeps_its_exit_code(capsys):
    """Ctrl-C or SIGTERM while the report's files are written: they are completed, then it is said, and the
    command ends with the report's exit code (before, it said nothing was written and exited 130)."""
    import os
    import signal

    import typer

    from vlmfast.cli.common import finishing

    written, before = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(typer.Exit) as ended:
        with finishing(5):
            written.append("report.json")
            os.kill(os.getpid(), signal.SIGTERM)
            written.append("report.html")
    assert ended.value.exit_code == 5 and written == ["report.json", "report.html"]
    assert "it was written whole first" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # restored
    with finishing(0):  # nothing held: nothing said, no exit
        written.append("plot.png")
    assert written[-1] == "plot.png"
    with pytest.raises(KeyboardInterrupt):  # asked twice: stops at once
        with finishing(0):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            written.append("never")
    assert written[-1] == "plot.png" and signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("command, stopped, says", [
    ("bench", "vlmfast.run.bench.run_bench", "nothing was written (bench writes its report only once every scenario is "
                                             "measured); rerun the same command to measure again"),
    ("infer", "vlmfast.run.runner.infer", "rerun the same command (a run given --out keeps the rows it wrote and "
                                          "resumes after them)"),
    ("sweep", "vlmfast.run.sweep.sweep", "rerun the same command (the checkpoints it finished are kept in --out-dir, "
                                         "and it goes on after the rows it wrote)"),
    ("score", "vlmfast.run.rescore.rescore_file", "rerun the same command (score writes each file whole or not at all, "
                                                  "and a rerun scores the rows again)"),
    ("convert", "vlmfast.inputs.convert.convert_file", "rerun the same command (the manifest is written whole or not "
                                                       "at all)"),
    ("doctor", "vlmfast.checkpoints.doctor.diagnose", "doctor writes nothing; rerun the same command"),
    ("fix", "vlmfast.checkpoints.fix.plan_fix", "rerun the same command (fix writes each file whole, and a rerun fixes "
                                                "what is left; a merge's folder appears only once it is complete)"),
])
def test_a_ctrl_c_says_what_a_rerun_of_that_command_does(command, stopped, says, grpo_ckpt, images, tmp_path,
                                                         monkeypatch):
    """Ctrl-C (or SIGTERM) inside each command's work exits 130 with that command's own hint: bench has no --out and
    resumes nothing (it promised infer's resume), doctor writes nothing, the others' reruns do what is said."""
    import importlib

    from vlmfast.errors import EXIT_INTERRUPTED

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    module, name = stopped.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, interrupted)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "Q", "solution": "1"}) + "\n")
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps({"id": "a", "text": "<answer>1</answer>"}) + "\n")
    args = {"bench": ("--ckpt", grpo_ckpt, "--synthetic", 1, "--json"),
            "infer": ("--ckpt", grpo_ckpt, "--images", images[0], "--out", tmp_path / "out.jsonl", "--json"),
            "sweep": (grpo_ckpt.parent, "--manifest", manifest, "--out-dir", tmp_path / "s", "--json"),
            "score": (results, "--manifest", manifest, "--json"),
            "convert": (manifest, "--out", tmp_path / "converted.jsonl"),
            "doctor": (grpo_ckpt, "--json"),
            "fix": (grpo_ckpt,)}[command]
    r = cli(command, *args)
    assert r.returncode == EXIT_INTERRUPTED, (r.stdout, r.stderr)
    assert f"interrupted; {says}." in " ".join(r.stderr.split()), r.stderr
    if "--json" in args:
        assert json.loads(r.stdout)["error"] == {"message": "interrupted", "hint": says, "problems": [],
                                                 "exit_code": EXIT_INTERRUPTED}
    assert ("resumes" in says) is (command == "infer")  # only infer has --out rows to resume after
