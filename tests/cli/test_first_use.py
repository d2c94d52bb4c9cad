"""Small things a first use trips on: what is printed once, what is said only when known, what the
package shows of itself."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import cli


def test_make_checkpoint_names_its_path_once(tmp_path):
    r = cli("make-checkpoint", tmp_path / "c")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "c")
    assert str(tmp_path / "c") not in r.stderr and "wrote a qwen2_5_vl checkpoint" in r.stderr


def test_doctor_says_no_step_count_it_does_not_know(grpo_ckpt, tmp_path):
    ckpt = shutil.copytree(grpo_ckpt, tmp_path / "checkpoint-300")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 300, "log_history": []}))
    r = cli("doctor", ckpt, "--json")
    messages = [f["message"] for f in json.loads(r.stdout)["findings"] if f["code"] == "trainer-state"]
    assert messages == ["saved at global_step 300"]


def test_dir_lists_the_lazy_exports():
    import vlmfast

    assert {"infer", "InferOptions", "load", "sweep", "__version__"} <= set(dir(vlmfast))


@pytest.mark.process_mechanism  # rich's output in a log
def test_reports_in_a_log_carry_no_trailing_padding(grpo_ckpt, images, tmp_path):
    """Not on a terminal, rich pads every line of the report's grid to its widest (150 columns of blanks in a log)."""
    from conftest import vlmfast

    r = vlmfast("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--max-new-tokens", 2,
                "--out", tmp_path / "r.jsonl")
    assert r.returncode == 0 and "vlmfast infer" in r.stderr and "checkpoint" in r.stderr
    assert [line for line in r.stderr.splitlines() if line != line.rstrip()] == []


def test_the_demos_speed_up_comes_with_what_it_is_worth():
    from vlmfast.cli.demo import timing_note

    assert timing_note(load=0.5, cores=2).startswith("one timed run each") and "vlmfast bench" in timing_note(0.5, 2)
    assert timing_note(load=5.2, cores=2).startswith("the machine is busy (1-minute load 5.2 on 2 cores)")
