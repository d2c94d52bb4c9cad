"""infer --reward hands reward functions what score --reward hands them: the manifest line's own ground truth,
data source and extra_info (verl), its columns (TRL), the generated ids; several functions summed with weights."""

import json

from conftest import FakeBackend, read_jsonl
from PIL import Image

from vlmfast.evaluation.rewards import load_rewards
from vlmfast.run.options import InferOptions
from vlmfast.run.rescore import rescore_file
from vlmfast.run.runner import infer

REWARDS = '''
SEEN = []

def verl_score(data_source, solution_str, ground_truth, extra_info=None):
    SEEN.append(("verl", data_source, ground_truth, extra_info))
    return {"score": 1.0 if data_source == "geo" and isinstance(ground_truth, str) else 0.5, "seen": 1.0}

def trl_ids(completions, solution, completion_ids, **kwargs):
    SEEN.append(("trl", solution, kwargs["split"], completion_ids))
    return [None if s == "<answer>B</answer>" else 2.0 for s in solution]

def n_ids(completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]
'''


def test_infer_and_score_hand_the_functions_the_same_manifest_values(tmp_path):
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"im{i}.png"))
        Image.new("RGB", (56, 56), (i * 60, 40, 90)).save(paths[-1])
    lines = [{"id": "q0", "image": paths[0], "prompt": "Roots?", "solution": "[-2,7]", "data_source": "geo",
              "extra_info": {"index": 0}, "split": "test"},
             {"id": "q1", "image": paths[1], "prompt": "Which?", "solution": "<answer>B</answer>", "split": "test"},
             {"id": "q2", "image": paths[2], "prompt": "Count?", "solution": 4, "data_source": "count", "split": "val"}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "rewards.py").write_text(REWARDS)
    specs = [f"{tmp_path / 'rewards.py'}:verl_score", f"{tmp_path / 'rewards.py'}:trl_ids"]
    out = tmp_path / "r.jsonl"
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), reward=specs, reward_weights="1,0.25",
                                batch_size=3), backend=FakeBackend(tokens=5))
    rows = read_jsonl(out)
    assert [r["rewards"] for r in rows] == [{"verl_score": 1.0, "trl_ids": 2.0}, {"verl_score": 0.5, "trl_ids": None},
                                            {"verl_score": 0.5, "trl_ids": 2.0}]
    assert [r["score"] for r in rows] == [1.5, 0.5, 1.0] and rows[0]["reward_scores"] == {"verl_score/seen": 1.0}
    assert report.scores["rewards"]["functions"]["trl_ids"] == {"mean": 2.0, "not_applicable_rows": 1}
    rewards = load_rewards(specs, weights=[1, 0.25])
    seen_infer = list(rows)
    again = rescore_file(out, str(manifest), reward=rewards, out=tmp_path / "again.jsonl")
    assert read_jsonl(tmp_path / "again.jsonl") == seen_infer and again["mean_score"] == 1.0
    seen = rewards.rewards[0].fn.__globals__["SEEN"]
    verl_calls = [s for s in seen if s[0] == "verl"]
    assert verl_calls == [("verl", "geo", "[-2,7]", {"index": 0, "num_turns": None, "rollout_reward_scores": {}}),
                          ("verl", None, "<answer>B</answer>", {"num_turns": None, "rollout_reward_scores": {}}),
                          ("verl", "count", 4, {"num_turns": None, "rollout_reward_scores": {}})]
    trl_calls = [s for s in seen if s[0] == "trl"]
    assert trl_calls == [("trl", ["[-2,7]", "<answer>B</answer>", 4], ["test", "test", "val"], [None, None, None])]
    # a results file keeps no token ids; infer hands the generated ones over, as TRL's completion_ids
    infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(tmp_path / "ids.jsonl"),
                       reward=f"{tmp_path / 'rewards.py'}:n_ids", batch_size=3), backend=FakeBackend(tokens=5))
    assert [r["score"] for r in read_jsonl(tmp_path / "ids.jsonl")] == [5.0, 5.0, 5.0]


def test_a_reward_that_cannot_be_called_fails_before_anything_generates(tmp_path):
    """A reward needing a column the manifest lacks fails on a check call made before the model loads, naming
    the function and the row; no batch runs, nothing is written."""
    import pytest

    from vlmfast.errors import RewardError

    image = tmp_path / "im.png"
    Image.new("RGB", (56, 56)).save(image)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "q0", "image": str(image), "prompt": "Count?", "solution": "3"}) + "\n")
    rewards = tmp_path / "needs.py"
    rewards.write_text("def accuracy(completions, solution, difficulty, **kwargs):\n"
                       "    return [1.0 for _ in completions]\n")
    backend, out = FakeBackend(), tmp_path / "r.jsonl"
    with pytest.raises(RewardError, match=r"before loading the model.*accuracy .*row q0: TypeError"):
        infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), reward=[f"{rewards}:accuracy"]),
              backend=backend)
    assert backend.batches_run == 0 and not out.exists()


def test_a_reward_that_raises_with_skip_bad_is_counted_not_hidden(tmp_path, capsys):
    """--skip-bad keeps a raising reward's row as reward_error: the report counts it (terminal and JSON),
    for infer and score alike, instead of "0 errors" and an accuracy over the rows left."""
    from conftest import cli
    from vlmfast.report.terminal import render_infer

    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"im{i}.png"))
        Image.new("RGB", (56, 56), (i * 60, 40, 90)).save(paths[-1])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": p, "prompt": "?", "solution": "A" if i else "boom"}) + "\n"
                                for i, p in enumerate(paths)))
    rewards = tmp_path / "picky.py"
    rewards.write_text("def acc(completions, solution, **kwargs):\n"
                       "    if 'boom' in solution:\n        raise ValueError('cannot parse boom')\n"
                       "    return [1.0 for _ in completions]\n")
    out = tmp_path / "r.jsonl"
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), reward=f"{rewards}:acc",
                                skip_bad=True, batch_size=1), backend=FakeBackend())
    assert report.scores["reward_errors"] == 1 and report.scores["scored"] == 2
    capsys.readouterr()
    render_infer(report)
    assert "1 reward error" in capsys.readouterr().err
    r = cli("score", out, "--manifest", manifest, "--reward", f"{rewards}:acc", "--skip-bad", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["reward_errors"] == 1
    assert "1 row whose reward function raised" in r.stderr


# EasyR1's math reward's shape (examples/reward_function/math.py): overall = 0.9·accuracy + 0.1·format, its
# format a \boxed{} answer inside <think>…</think>, which these answers lack.
EASYR1_MATH = '''
REWARD_TYPE = "batch"

def compute_score(reward_inputs, format_weight=0.1):
    out = []
    for x in reward_inputs:
        accuracy = float(x["response"].endswith(f"<answer>{x['ground_truth']}</answer>"))
        fmt = float("\\\\boxed{" in x["response"])
        out.append({"overall": (1 - format_weight) * accuracy + format_weight * fmt, "format": fmt, "accuracy": accuracy})
    return out
'''


def test_a_reward_with_an_accuracy_sub_score_decides_correctness_by_it(tmp_path, capsys, monkeypatch):
    """A right answer without the reward's format scores overall 0.9 < --reward-threshold 1.0; its accuracy
    sub-score says it is right: that is the row's correctness, said in the report, with every sub-score's mean."""
    from conftest import cli
    from vlmfast.report.terminal import render_infer

    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"im{i}.png"))
        Image.new("RGB", (56, 56), (i * 60, 40, 90)).save(paths[-1])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": p, "prompt": "?", "answer": "A" if i < 3 else "B"}) + "\n"
                                for i, p in enumerate(paths)))
    (tmp_path / "math.py").write_text(EASYR1_MATH)
    out = tmp_path / "r.jsonl"
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), reward=f"{tmp_path / 'math.py'}:compute_score"),
                   backend=FakeBackend())
    rows = read_jsonl(out)
    assert [r["score"] for r in rows] == [0.9, 0.9, 0.9, 0.0] and [r["correct"] for r in rows] == [True, True, True, False]
    assert report.scores["accuracy"] == 0.75
    assert report.scores["rewards"]["subscores"] == {"format": 0.0, "accuracy": 0.75}
    assert report.scores["rewards"]["correct_from"] == "accuracy"
    from vlmfast.report import terminal

    # the console's width was fixed when it was made (COLUMNS then, or the terminal's): pin it for this table
    monkeypatch.setattr(terminal.stderr, "width", 200)
    capsys.readouterr()
    render_infer(report)
    err = capsys.readouterr().err
    assert "sub-scores: format 0.000 · accuracy 0.750" in err and "correct: its accuracy sub-score" in err
    r = cli("score", out, "--manifest", manifest, "--reward", f"{tmp_path / 'math.py'}:compute_score", "--json")
    assert json.loads(r.stdout)["accuracy"] == 0.75 and "correct: its accuracy sub-score" in r.stderr
