"""Reward functions in each trainer's calling convention, scored through ``vlmfast score --reward``'s path
(vlmfast.run.rescore.rescore_file): each row's reward equals a direct call made the way the trainer makes
it, and the ground truth the function sees is the manifest's value, byte for byte."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
from conftest import cli, read_jsonl

from vlmfast.errors import UsageError
from vlmfast.evaluation.rewards import load_reward, load_rewards
from vlmfast.run.rescore import rescore_file

# Ground truths a trainer must receive untouched: JSON-looking text, answer tags, a number, a box list.
LINES = [
    {"id": "a", "image": "img/a.png", "prompt": "Solve x^2-5x-14=0.", "solution": "[-2,7]", "data_source": "geo",
     "extra_info": {"split": "test", "index": 3}, "problem": "x^2-5x-14=0", "accu_reward_method": "math"},
    {"id": "b", "image": "img/b.png", "prompt": "How many?", "solution": "<answer>5</answer>", "data_source": "count"},
    {"id": "c", "image": "img/c.png", "prompt": "What is 1+2?", "answer": 3},
    {"id": "d", "image": "img/d.png", "prompt": "Find the cup.", "solution": [10, 20, 110, 220]},
]
ROWS = [
    {"id": "a", "text": "<think>factor</think><answer>[-2,7]</answer>", "n_new_tokens": 14, "prompt": "Solve x^2-5x-14=0.",
     "images": ["/data/img/a.png"], "model_image_sizes": [[280, 140]], "image_sizes": [[560, 280]]},
    {"id": "b", "text": "<think>count</think><answer>5</answer>", "n_new_tokens": 9, "prompt": "How many?",
     "images": ["/data/img/b.png"]},
    {"id": "c", "text": "three", "n_new_tokens": 2, "prompt": "What is 1+2?", "images": ["/data/img/c.png"]},
    {"id": "d", "text": "<answer>{\"bbox_2d\": [5, 10, 55, 110]}</answer>", "n_new_tokens": 20, "prompt": "Find the cup.",
     "images": ["/data/img/d.png"], "model_image_sizes": [[28, 56]], "image_sizes": [[56, 112]]},
]
TRUTH = {line["id"]: line.get("solution", line.get("answer")) for line in LINES}


@pytest.fixture
def setup(tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in ROWS))

    def write(name, source):
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    def score(reward, **options):
        out = tmp_path / "scored.jsonl"
        summary = rescore_file(results, str(manifest), reward=reward, out=out, **options)
        return summary, {row["id"]: row for row in read_jsonl(out)}

    return write, score


def _module(reward):
    return reward.fn.__globals__


EASYR1_BATCH = '''
REWARD_NAME = "toy_math"
REWARD_TYPE = "batch"
SEEN = []

def compute_score(reward_inputs, format_weight=0.1):
    SEEN.append([dict(x) for x in reward_inputs])
    return [{"overall": (1 - format_weight) * (str(x["ground_truth"]) in x["response"]) + format_weight,
             "length": x["response_length"]} for x in reward_inputs]
'''
# REWARD_TYPE says sequential although the first parameter's name says nothing: the file's word wins.
EASYR1_SEQUENTIAL = '''
REWARD_TYPE = "sequential"
SEEN = []

def main(item, format_weight=0.5):
    SEEN.append(dict(item))
    return {"overall": float(repr(item["ground_truth"]) in item["response"] or str(item["ground_truth"]) in item["response"]),
            "format": format_weight}
'''
EASYR1_LEGACY = '''
SEEN = []

def compute_score(predict_str, ground_truth, format_weight=0.1):
    SEEN.append(ground_truth)
    return {"overall": 1.0 if str(ground_truth) in predict_str else format_weight, "accuracy": 0.0}
'''
EASYR1_DAPO = '''
REWARD_TYPE = "batch"

def compute_score(reward_inputs, max_response_length, overlong_buffer_length, overlong_penalty_factor):
    out = []
    for x in reward_inputs:
        expected = max_response_length - overlong_buffer_length
        n = x["response_length"]
        over = 0.0 if n <= expected else ((expected - n) / overlong_buffer_length if n <= max_response_length else -1.0)
        out.append({"overall": 1.0 + over * overlong_penalty_factor, "overlong": over})
    return out
'''
TRL = '''
SEEN = []

def accuracy(completions, solution, **kwargs):
    SEEN.append({"solution": solution, **kwargs})
    return [None if s is None else float(str(s) in c[0]["content"]) for c, s in zip(completions, solution)]

def only_tagged(completions, solution, **kwargs):
    return [1.0 if isinstance(s, str) and s.startswith("<answer>") else None for s in solution]

def length(completions, **kwargs):
    return [len(c[0]["content"]) / 100 for c in completions]
'''
# VLM-R1's REC reward reads the grid and the image path it is handed (the image size comes with the row here).
VLMR1_REC = '''
import re

def iou_reward(completions, solution, **kwargs):
    rewards = []
    for i, (c, sol) in enumerate(zip(completions, solution)):
        grid, path = kwargs["image_grid_thw"][i], kwargs["image_path"][i][0]
        m = re.search(r"\\[(\\d+),\\s*(\\d+),\\s*(\\d+),\\s*(\\d+)]", c[0]["content"])
        if grid is None or m is None or not isinstance(sol, list):
            rewards.append(0.0)
            continue
        scale = 2.0 / (int(grid[2] * 14) / 28)  # the toy images are twice the 28-px-per-unit input
        x1, y1, x2, y2 = (int(v) * scale for v in m.groups())
        rewards.append(round((x2 - x1) * (y2 - y1) / ((sol[2] - sol[0]) * (sol[3] - sol[1])), 6) + len(path) / 1000)
    return rewards
'''
VERL = '''
SEEN = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    SEEN.append((data_source, ground_truth, extra_info))
    if data_source == "geo":
        return {"score": float(ground_truth in solution_str), "acc": 1.0}
    if data_source == "count":
        return 0.5
    raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
'''


def test_easyr1_batch_by_reward_type(setup):
    write, score = setup
    reward = load_reward(f"{write('math_reward.py', EASYR1_BATCH)}:compute_score")
    assert (reward.kind, reward.label) == ("easyr1-batch", "toy_math")
    _, got = score(reward)
    seen = _module(reward)["SEEN"]
    assert len(seen) == 1 and [x["ground_truth"] for x in seen[0]] == [TRUTH[i] for i in "abcd"]
    assert seen[0][0] == {"response": ROWS[0]["text"], "response_length": 14, "ground_truth": "[-2,7]"}
    direct = reward.fn([{"response": r["text"], "response_length": r["n_new_tokens"], "ground_truth": TRUTH[r["id"]]}
                        for r in ROWS])
    assert [got[i]["score"] for i in "abcd"] == [d["overall"] for d in direct] == [1.0, 1.0, 0.1, 0.1]
    assert got["a"]["reward_scores"] == {"length": 14.0} and got["a"]["scorer"] == "reward:compute_score"


def test_easyr1_sequential_by_reward_type_one_call_per_row(setup):
    write, score = setup
    reward = load_reward(f"{write('seq.py', EASYR1_SEQUENTIAL)}:main")
    assert reward.kind == "easyr1"
    _, got = score(reward)
    seen = _module(reward)["SEEN"]
    assert [x["ground_truth"] for x in seen] == ["[-2,7]", "<answer>5</answer>", 3, [10, 20, 110, 220]]
    assert all(set(x) == {"response", "response_length", "ground_truth"} for x in seen)
    direct = [reward.fn({"response": r["text"], "response_length": r["n_new_tokens"], "ground_truth": TRUTH[r["id"]]})
              for r in ROWS]
    assert [got[i]["score"] for i in "abcd"] == [d["overall"] for d in direct] == [1.0, 1.0, 0.0, 0.0]


def test_easyr1_legacy_positional(setup):
    write, score = setup
    reward = load_reward(f"{write('score_function.py', EASYR1_LEGACY)}:compute_score")
    assert reward.kind == "easyr1-legacy"
    _, got = score(reward)
    assert _module(reward)["SEEN"] == ["[-2,7]", "<answer>5</answer>", 3, [10, 20, 110, 220]]
    direct = [reward.fn(r["text"], TRUTH[r["id"]])["overall"] for r in ROWS]
    assert [got[i]["score"] for i in "abcd"] == direct == [1.0, 1.0, 0.1, 0.1]


def test_easyr1_bound_kwargs_as_reward_function_kwargs(setup):
    write, score = setup
    path = write("dapo.py", EASYR1_DAPO)
    with pytest.raises(UsageError, match="not a reward function signature") as err:
        load_reward(f"{path}:compute_score")
    assert "--reward-kwargs" in err.value.hint and "max_response_length" in err.value.hint
    bound = {"max_response_length": 16, "overlong_buffer_length": 8, "overlong_penalty_factor": 0.5}
    rewards = load_rewards([f"{path}:compute_score"], kwargs=json.dumps(bound))
    _, got = score(rewards)
    direct = rewards.rewards[0].fn([{"response": r["text"], "response_length": r["n_new_tokens"],
                                     "ground_truth": TRUTH[r["id"]]} for r in ROWS], **bound)
    assert [got[i]["score"] for i in "abcd"] == [d["overall"] for d in direct] == [0.625, 0.9375, 1.0, 0.5]


def _trl_direct(fn, rows=ROWS):
    """TRL's _calculate_rewards: every dataset column as a list (None where a line lacks it), then the rest."""
    columns = []
    for line in LINES:
        columns += [k for k in line if k not in columns and k != "prompt"]
    kwargs = {k: [line.get(k) for line in LINES] for k in columns}
    kwargs.setdefault("solution", [TRUTH[i] for i in "abcd"])
    completions = [[{"role": "assistant", "content": r["text"]}] for r in rows]
    out = fn(prompts=[None] * len(rows), completions=completions, completion_ids=[None] * len(rows), trainer_state=None,
             **kwargs)
    return [math.nan if v is None else v for v in out]


def test_trl_gets_every_column_and_none_is_not_applicable(setup):
    write, score = setup
    path = write("trl_rewards.py", TRL)
    reward = load_reward(f"{path}:accuracy")
    assert reward.kind == "trl"
    summary, got = score(reward)
    seen = _module(reward)["SEEN"][0]
    assert seen["solution"] == ["[-2,7]", "<answer>5</answer>", None, [10, 20, 110, 220]]  # "c" has no solution column
    assert seen["answer"] == [None, None, 3, None] and seen["data_source"] == ["geo", "count", None, None]
    assert seen["extra_info"] == [{"split": "test", "index": 3}, None, None, None]
    assert seen["image"] == ["img/a.png", "img/b.png", "img/c.png", "img/d.png"]
    assert seen["image_path"] == [["/data/img/a.png"], ["/data/img/b.png"], ["/data/img/c.png"], ["/data/img/d.png"]]
    assert seen["completion_ids"] == [None] * 4 and seen["trainer_state"] is None
    assert seen["prompts"][1] == [{"role": "user", "content": [{"type": "image", "text": None},
                                                              {"type": "text", "text": "How many?"}]}]
    direct = _trl_direct(reward.fn)
    assert [got[i]["score"] for i in "abd"] == [direct[0], direct[1], direct[3]] == [1.0, 1.0, 0.0]
    assert math.isnan(direct[2]) and got["c"]["score"] is None and got["c"]["correct"] is None
    assert got["c"]["rewards"] == {"accuracy": None}
    assert summary["rewards"] == {"functions": {"accuracy": {"mean": 2 / 3, "not_applicable_rows": 1}},
                                  "not_applicable_rows": 1}
    assert summary["scored"] == 3  # the row the function called not applicable is left out


def test_several_functions_weighted_and_summed_as_trl(setup):
    write, score = setup
    path = write("trl_rewards.py", TRL)
    rewards = load_rewards([f"{path}:only_tagged", f"{path}:length"], weights="1,0.5")
    summary, got = score(rewards)
    tagged, length = _trl_direct(rewards.rewards[0].fn), _trl_direct(rewards.rewards[1].fn)
    want = [sum(w * v for w, v in ((1.0, t), (0.5, n)) if not math.isnan(v)) for t, n in zip(tagged, length)]
    assert [got[i]["score"] for i in "abcd"] == want
    assert got["b"]["rewards"] == {"only_tagged": 1.0, "length": 0.38} and got["a"]["rewards"]["only_tagged"] is None
    assert got["a"]["scorer"] == "reward:only_tagged+length"
    functions = summary["rewards"]["functions"]
    assert functions["only_tagged"] == {"mean": 1.0, "not_applicable_rows": 3}
    assert functions["length"]["mean"] == pytest.approx(sum(len(r["text"]) for r in ROWS) / 400)
    with pytest.raises(UsageError, match="1 weight"):
        load_rewards([f"{path}:only_tagged", f"{path}:length"], weights="1")


def test_vlmr1_rec_reward_gets_grid_and_image_paths(setup):
    write, score = setup
    reward = load_reward(f"{write('rec.py', VLMR1_REC)}:iou_reward")
    _, got = score(reward)
    grids = {"a": [1, 10, 20], "d": [1, 4, 2]}  # model_image_sizes [w, h] → [t, h / 14, w / 14]
    completions = [[{"role": "assistant", "content": r["text"]}] for r in ROWS]
    direct = reward.fn(completions, [TRUTH[i] for i in "abcd"], image_grid_thw=[grids.get(i) for i in "abcd"],
                       image_path=[r["images"] for r in ROWS])
    assert [got[i]["score"] for i in "abcd"] == direct and direct[3] == pytest.approx(1.015)


def test_verl_data_source_and_extra_info_from_the_manifest_line(setup):
    write, score = setup
    reward = load_reward(f"{write('verl_reward.py', VERL)}:compute_score")
    with pytest.raises(Exception, match="NotImplementedError: Reward function is not implemented for data_source=None"):
        score(reward)
    _, got = score(reward, skip_bad=True)
    seen = _module(reward)["SEEN"]
    assert seen[0] == ("geo", "[-2,7]", {"split": "test", "index": 3, "num_turns": None, "rollout_reward_scores": {}})
    assert seen[1] == ("count", "<answer>5</answer>", {"num_turns": None, "rollout_reward_scores": {}})
    direct = [reward.fn(data_source=line.get("data_source"), solution_str=r["text"], ground_truth=TRUTH[r["id"]],
                        extra_info={**line.get("extra_info", {}), "num_turns": None, "rollout_reward_scores": {}})
              for line, r in zip(LINES[:2], ROWS[:2])]
    assert [got["a"]["score"], got["b"]["score"]] == [direct[0]["score"], direct[1]] == [1.0, 0.5]
    assert got["a"]["reward_scores"] == {"acc": 1.0} and got["c"]["reward_error"].startswith("NotImplementedError")


def test_score_command_takes_several_rewards_weights_and_kwargs(setup, tmp_path):
    write, _ = setup
    trl, dapo = write("trl_rewards.py", TRL), write("dapo.py", EASYR1_DAPO)
    out = tmp_path / "cli.jsonl"
    bound = '{"max_response_length": 16, "overlong_buffer_length": 8, "overlong_penalty_factor": 0.5}'
    result = cli("score", tmp_path / "results.jsonl", "--manifest", tmp_path / "manifest.jsonl", "--reward",
                 f"{dapo}:compute_score", "--reward", f"{trl}:length", "--reward-weights", "2,1", "--reward-kwargs",
                 bound, "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert rows["c"]["rewards"] == {"compute_score": 1.0, "length": 0.05} and rows["c"]["score"] == 2.05
    assert "reward length: mean" in result.stderr
    bad = cli("score", tmp_path / "results.jsonl", "--manifest", tmp_path / "manifest.jsonl", "--reward",
              f"{trl}:length", "--reward-kwargs", "[1]")
    assert bad.returncode == 2 and "expected a JSON object" in bad.stderr


def _vlmr1_data(tmp_path):
    """A VLM-R1 REC JSONL as its trainer reads it (relative image names under the JSONL's folder, the
    --image_folders the trainer joins), results rows with boxes in the model's input pixels (half the image)."""
    from PIL import Image

    folder = tmp_path / "rec"
    folder.mkdir()
    Image.new("RGB", (224, 112), (200, 30, 30)).save(folder / "a.png")
    Image.new("RGB", (140, 112), (30, 30, 200)).save(folder / "b.png")
    ask = "<image>Please provide the bounding box coordinate of the region this sentence describes: {}."
    lines = [{"id": 1, "image": "a.png", "conversations": [{"from": "human", "value": ask.format("the left cup")},
                                                          {"from": "gpt", "value": "[10, 20, 110, 80]"}]},
             {"image": "b.png", "conversations": [{"from": "human", "value": ask.format("the plate")},
                                                  {"from": "gpt", "value": "<answer>[5, 5, 60, 45]</answer>"}],
              "accu_reward_method": "default"},
             {"image": "a.png", "conversations": [{"from": "human", "value": ask.format("the right cup")},
                                                  {"from": "gpt", "value": "[120, 10, 210, 100]"}]}]
    manifest = folder / "rec_val.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    answers = ["[6, 9, 56, 41]", "[5, 5, 60, 45]", "<think>x</think> [1, 2, 3, 4]"]  # the last: no answer tags
    sizes = [[112, 56], [140, 112], [112, 56]]
    rows = [{"id": rid, "text": f"<think>look</think><answer>{a}</answer>" if "<think>" not in a else a,
             "images": [str(folder / line["image"])], "model_image_sizes": [size]}
            for rid, a, size, line in zip(["1", "00001_b", "00002_a"], answers, sizes, lines)]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, manifest, results, rows, sizes


@pytest.mark.parametrize("commit", ["90052f4", "f4f3665"])
def test_vlmr1_rec_reward_on_its_own_jsonl_equals_its_trainer(tmp_path, commit, monkeypatch):
    """VLM-R1's iou_reward (HEAD and the commit before its resize change), fed VLM-R1's own JSONL through
    score --reward, gives per row what VLM-R1's trainer computes: the columns its loader makes (solution
    re-wrapped in answer tags, image paths as a list, problem, accu_reward_method) and the processor's grid."""
    import runpy

    from PIL import Image
    from vlmr1_loader import QWEN_MODULES, grpo_jsonl_rows

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # Pillow's own (an earlier test may have set a small one)

    folder, manifest, results, rows, sizes = _vlmr1_data(tmp_path)
    trainer_rows = grpo_jsonl_rows(str(manifest), str(folder))
    columns = {key: [row.get(key) for row in trainer_rows] for row in trainer_rows for key in row}
    completions = [[{"role": "assistant", "content": r["text"]}] for r in rows]
    grids = [[1, h // 14, w // 14] for w, h in sizes]
    iou_reward = runpy.run_path(str(QWEN_MODULES[commit]))["Qwen2VLModule"].iou_reward
    expected = iou_reward(completions, image_grid_thw=grids, **columns)
    assert max(expected) > 0.9 and expected[2] == 0.0  # a real overlap, and an untagged answer

    out = tmp_path / "scored.jsonl"
    r = cli("score", results, "--manifest", manifest, "--reward", f"{QWEN_MODULES[commit]}:Qwen2VLModule.iou_reward",
            "--reward-threshold", "0.5", "--out", out)
    assert r.returncode == 0, r.stderr
    assert [row["score"] for row in read_jsonl(out)] == expected

    seen = tmp_path / "seen.py"
    seen.write_text("SEEN = []\n\ndef columns(completions, solution, **kwargs):\n"
                    "    SEEN.append({'solution': solution, **kwargs})\n    return [0.0 for _ in completions]\n")
    reward = load_reward(f"{seen}:columns")
    rescore_file(results, str(manifest), reward=reward)
    handed = _module(reward)["SEEN"][-1]
    assert {k: handed[k] for k in columns} == columns
    assert handed["solution"][0] == "<answer> [10, 20, 110, 80] </answer>" and handed["image_path"][0] == [str(folder / "a.png")]


ACCURACY_AND_FORMAT = '''
import re

def accuracy_reward(completions, solution, **kwargs):
    said = [re.search(r"<answer>(.*?)</answer>", c[0]["content"]) for c in completions]
    return [float(m is not None and m.group(1).strip() == s) for m, s in zip(said, solution)]

def format_reward(completions, **kwargs):
    return [float(re.fullmatch(r"<think>.*?</think><answer>.*?</answer>", c[0]["content"], re.S) is not None)
            for c in completions]

def length_reward(completions, **kwargs):
    return [min(len(c[0]["content"]) / 40, 1.0) for c in completions]
'''


def test_summed_accuracy_and_format_rewards_judge_correctness_by_the_accuracy(tmp_path):
    """VLM-R1's and TRL's accuracy_reward + format_reward: a well-formatted wrong answer totals 1.0, which
    must not count as right; the accuracy function decides, and the score stays the sum."""
    path = tmp_path / "rec_rewards.py"
    path.write_text(ACCURACY_AND_FORMAT)
    rows = [{"id": i, "text": text, "error": None} for i, text in
            enumerate(["<think>a</think><answer>3</answer>", "<think>a</think><answer>4</answer>", "4", "3"])]
    truths = {str(i): {"ground_truth": "3"} for i in range(4)}
    rewards = load_rewards([f"{path}:accuracy_reward", f"{path}:format_reward"])
    got = rewards.score_rows(rows, truths)
    assert [g["score"] for g in got] == [2.0, 1.0, 0.0, 0.0]
    assert [g["correct"] for g in got] == [True, False, False, False]
    assert rewards.note == "correct: accuracy_reward ≥ 1 (the accuracy among 2 reward functions; score is their weighted sum)"
    unnamed = load_rewards([f"{path}:format_reward", f"{path}:length_reward"])  # no accuracy among them: the total, said
    assert unnamed.judge is None and "none of them is named as an accuracy" in unnamed.note
    assert load_rewards([f"{path}:accuracy_reward"]).note is None


def test_an_accuracy_function_that_returns_none_leaves_the_row_unjudged(tmp_path):
    """TRL's accuracy_reward returns None when the truth does not parse (its nanmean leaves the row out): the
    format reward's 1.0 alone must not make the answer right; the row is unjudged and out of the accuracy."""
    from vlmfast.evaluation.stats import summarize

    path = tmp_path / "trl_rewards.py"
    path.write_text(ACCURACY_AND_FORMAT.replace("    return [float(m is not None and m.group(1).strip() == s)",
                                                "    return [None if s == 'unparsable' else float(m is not None and m.group(1).strip() == s)"))
    rows = [{"id": i, "text": "<think>a</think><answer>B</answer>", "error": None} for i in range(2)]
    truths = {"0": {"ground_truth": "unparsable"}, "1": {"ground_truth": "B"}}
    got = load_rewards([f"{path}:accuracy_reward", f"{path}:format_reward"]).score_rows(rows, truths)
    assert [(g["score"], g["correct"]) for g in got] == [(1.0, None), (2.0, True)]
    summary = summarize([{**row, **g} for row, g in zip(rows, got)])
    assert summary["accuracy"] == 1.0  # over the one judged row, not 1 of 2
