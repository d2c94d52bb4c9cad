"""Train ↔ eval parity: the training configuration a run leaves beside its checkpoints (ms-swift args.json,
EasyR1 experiment_config.json, verl Hydra config), compared with what an evaluation will use; --match-training
adopts it; doctor lists the differences. No model is loaded: checkpoints are config files and an empty
safetensors file, runs go through a fake backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from conftest import FakeBackend, cli
from vlmfast.checkpoints.training import LOOKED_FOR, Setting, search_dirs, training_settings
from vlmfast.run.options import InferOptions
from vlmfast.run.parity import evaluation_settings, match_training, parity, parity_report

R1 = ("First output the thinking process in <think> </think> tags and then output the final answer in "
      "<answer> </answer> tags.")
MATH = ("{{ content | trim }} You FIRST think about the reasoning process as an internal monologue and then provide "
        "the final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
        "BE put in \\boxed{}.")


def _checkpoint(d: Path) -> Path:
    """A locatable checkpoint without a model: config.json, an empty (valid) safetensors file, pixel limits."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "use_cache": True}))
    header = b'{"__metadata__":{"format":"pt"}}'
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (d / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 12845056,
                                                            "patch_size": 14}))
    return d


def _easyr1(tmp: Path, prompt: str = MATH, steps=(10,)) -> tuple[Path, Path]:
    """EasyR1's save_checkpoint_path: experiment_config.json (its file logger's, keys as PPOConfig.to_dict
    writes them after post_init) beside global_step_N/actor/huggingface."""
    root = tmp / "checkpoints" / "easy_r1" / "qwen2_5_vl_3b_geo"
    tmp.mkdir(parents=True, exist_ok=True)
    jinja, reward = tmp / "format.jinja", tmp / "r1v.py"
    jinja.write_text(prompt + "\n")
    reward.write_text("def compute_score(reward_inputs, format_weight=0.5):\n    return [{'overall': 1.0}] * len(reward_inputs)\n")
    ckpts = [_checkpoint(root / f"global_step_{s}" / "actor" / "huggingface") for s in steps]
    config = {"data": {"format_prompt": str(jinja), "max_response_length": 2048, "min_pixels": 262144,
                       "max_pixels": 4194304, "max_prompt_length": 2048},
              "worker": {"rollout": {"n": 5, "temperature": 1.0, "top_p": 1.0,
                                     "val_override_config": {"temperature": 0.6, "top_p": 0.95, "n": 1}},
                         "reward": {"reward_function": str(reward), "reward_function_name": "compute_score",
                                    "reward_function_kwargs": {"format_weight": 0.1}}},
              "trainer": {"save_checkpoint_path": str(root), "logger": ["file"]}}
    (root / "experiment_config.json").write_text(json.dumps(config, indent=2))
    return root, ckpts[-1]


def _swift(tmp: Path) -> tuple[Path, Path]:
    """ms-swift: output/vX-YYYYMMDD-HHMMSS/args.json and a copy in each checkpoint-N (here with another
    temperature: the checkpoint's own file wins)."""
    run = tmp / "output" / "v0-20250301-101500"
    ckpt = _checkpoint(run / "checkpoint-50")
    args = {"model": "Qwen/Qwen2.5-VL-3B-Instruct", "rlhf_type": "grpo", "train_type": "full",
            "system": "You are a helpful assistant.", "max_completion_length": 1024, "num_generations": 8,
            "temperature": 0.9, "top_p": 1.0, "reward_funcs": ["accuracy", "format"], "reward_weights": [1.0, 0.5],
            "max_pixels": 1003520, "stop_words": [], "max_new_tokens": 64}
    (run / "args.json").write_text(json.dumps(args))
    (ckpt / "args.json").write_text(json.dumps({**args, "temperature": 1.0}))
    (ckpt / "training_args.bin").write_bytes(b"\x80\x04not unpickled")
    return run, ckpt


def _rows(rows):
    return {r["name"]: (r["training"], r["evaluation"], r["same"], r["source"]) for r in rows}


def test_swift_args_json_nearest_file_first_and_the_pickle_is_named_not_read(tmp_path):
    run, ckpt = _swift(tmp_path)
    t = training_settings(ckpt)
    assert t.trainer == "ms-swift" and t.files == [str(ckpt / "args.json"), str(run / "args.json")]
    assert t.values == {
        "system": Setting("You are a helpful assistant.", "args.json: system"),
        "max_pixels": Setting(1003520, "args.json: max_pixels"),
        "max_new_tokens": Setting(1024, "args.json: max_completion_length"),
        "temperature": Setting(1.0, "args.json: temperature"),  # the checkpoint's own copy
        "top_p": Setting(1.0, "args.json: top_p"), "n": Setting(8, "args.json: num_generations"),
        "reward": Setting(["accuracy", "format"], "args.json: reward_funcs"),
        "reward_weights": Setting([1.0, 0.5], "args.json: reward_weights")}
    assert t.notes == [f"{ckpt / 'training_args.bin'}: a pickle, not read (loading it could run code)"]
    assert search_dirs(ckpt) == [ckpt, run, run.parent]
    rows = _rows(parity(t, InferOptions(ckpt=str(ckpt))))
    assert rows["temperature"] == (1.0, 0.0, False, "args.json: temperature")
    assert rows["max_pixels"] == (1003520, 1003520, True, "args.json: max_pixels")  # the processor's, capped
    assert rows["n"] == (8, 1, False, "args.json: num_generations")
    assert rows["reward"] == (["accuracy", "format"], None, False, "args.json: reward_funcs")
    assert rows["system"] == ("You are a helpful assistant.", None, False, "args.json: system")


def test_swift_without_max_pixels_says_the_environment_set_them(tmp_path):
    ckpt = _checkpoint(tmp_path / "output" / "v1-20250301-101500" / "checkpoint-10")
    (ckpt.parent / "args.json").write_text(json.dumps({"rlhf_type": "grpo", "temperature": 0.9}))
    t = training_settings(ckpt)
    assert t.notes == [f"{ckpt.parent / 'args.json'}: no max_pixels; ms-swift then takes the pixel limits from the "
                       "MAX_PIXELS / MIN_PIXELS environment variables, which it does not record: compare them by hand"]


def test_easyr1_experiment_config_gives_the_parity_table(tmp_path):
    root, ckpt = _easyr1(tmp_path)
    t = training_settings(ckpt)
    assert t.trainer == "easyr1" and t.files == [str(root / "experiment_config.json")]
    rows = parity(t, InferOptions(ckpt=str(ckpt)))
    assert [r["setting"] for r in rows] == ["format prompt", "min pixels", "max pixels", "resize rule", "max new tokens", "temperature",
                                           "top p", "answers per prompt (n)", "reward function(s)", "reward kwargs"]
    got = _rows(rows)
    assert got["format_prompt"] == (MATH, "{prompt}", False, f"{tmp_path / 'format.jinja'} (data.format_prompt)")
    assert got["min_pixels"] == (262144, 3136, False, "experiment_config.json: data.min_pixels")
    assert got["max_pixels"] == (4194304, 1003520, False, "experiment_config.json: data.max_pixels")
    # EasyR1 scales images into those bounds, then the processor resizes: not Qwen's rule within them
    assert got["resize_rule"] == ("easyr1", "qwen", False, "experiment_config.json: data.min_pixels/max_pixels "
                                  "(EasyR1's process_image)")
    assert got["max_new_tokens"] == (2048, 1024, False, "experiment_config.json: data.max_response_length")
    assert got["temperature"] == (0.6, 0.0, False, "experiment_config.json: worker.rollout.val_override_config.temperature")
    assert got["top_p"] == (0.95, 1.0, False, "experiment_config.json: worker.rollout.val_override_config.top_p")
    assert got["n"] == (1, 1, True, "experiment_config.json: worker.rollout.val_override_config.n")
    assert got["reward"] == ([f"{tmp_path / 'r1v.py'}:compute_score"], None, False,
                             "experiment_config.json: worker.reward.reward_function")
    assert got["reward_kwargs"] == ({"format_weight": 0.1}, None, False,
                                    "experiment_config.json: worker.reward.reward_function_kwargs")
    # the same reward file given to the evaluation (another path to it, same name and function) is the same
    same = _rows(parity(t, InferOptions(ckpt=str(ckpt), reward=["r1v.py:compute_score"],
                                        reward_kwargs='{"format_weight": 0.1}')))
    assert same["reward"][2] is True and same["reward_kwargs"][2] is True


def test_verl_hydra_config_validation_kwargs(tmp_path):
    root = tmp_path / "verl_run"
    ckpt = _checkpoint(root / "global_step_20" / "actor" / "huggingface")
    (root / ".hydra").mkdir()
    (root / ".hydra" / "config.yaml").write_text(
        "data:\n  max_response_length: 1536\nactor_rollout_ref:\n  rollout:\n    temperature: 1.0\n    n: 5\n"
        "    val_kwargs:\n      do_sample: false\n      top_p: 1.0\n      n: 1\n"
        "custom_reward_function:\n  path: /data/reward.py\n  name: compute_score\n")
    t = training_settings(ckpt)
    assert t.trainer == "verl"
    assert {k: (s.value, s.source) for k, s in t.values.items()} == {
        "max_new_tokens": (1536, "config.yaml: data.max_response_length"),
        "temperature": (0.0, "config.yaml: actor_rollout_ref.rollout.val_kwargs.do_sample"),
        "top_p": (1.0, "config.yaml: actor_rollout_ref.rollout.val_kwargs.top_p"),
        "n": (1, "config.yaml: actor_rollout_ref.rollout.val_kwargs.n"),
        "reward": (["/data/reward.py:compute_score"], "config.yaml: custom_reward_function.path")}


def test_validation_answers_once_per_prompt_whatever_the_rollout_s_n(tmp_path):
    """EasyR1's _validate repeats a prompt val_override_config.get("n", 1) times and verl's val_kwargs.n
    times: the rollout's n (5 answers per prompt for the advantage) is never validation's."""
    root, ckpt = _easyr1(tmp_path / "e")
    config = json.loads((root / "experiment_config.json").read_text())
    del config["worker"]["rollout"]["val_override_config"]["n"]
    (root / "experiment_config.json").write_text(json.dumps(config))
    assert training_settings(ckpt).values["n"] == Setting(
        1, "experiment_config.json: worker.rollout.val_override_config (no n: one answer per prompt)")
    verl = tmp_path / "verl_run"
    ckpt = _checkpoint(verl / "global_step_20" / "actor" / "huggingface")
    (verl / ".hydra").mkdir()
    (verl / ".hydra" / "config.yaml").write_text("actor_rollout_ref:\n  rollout:\n    temperature: 1.0\n    n: 5\n")
    assert "n" not in training_settings(ckpt).values


def test_match_training_adopts_what_was_not_given_and_says_what_it_could_not(tmp_path):
    root, ckpt = _easyr1(tmp_path)
    t = training_settings(ckpt)
    given = InferOptions(ckpt=str(ckpt), images=["x.png"], prompt="Q?", match_training=True,
                         generation=InferOptions(ckpt="x").generation.__class__(temperature=0.3),
                         explicit=frozenset({"temperature", "images", "prompt"}))
    options, adopted, kept = match_training(given, t)
    g = options.generation
    assert (g.temperature, g.top_p, g.n, g.max_new_tokens) == (0.3, 0.95, 1, 2048)  # --temperature stays as given
    assert (options.min_pixels, options.max_pixels, options.template) == (262144, 4194304, "plain")
    assert options.resize_rule == "easyr1"
    assert options.reward == [f"{tmp_path / 'r1v.py'}:compute_score"] and options.reward_kwargs == '{"format_weight": 0.1}'
    reward = tmp_path / "r1v.py"
    assert options.format_prompt == str(tmp_path / "format.jinja")  # rendered as the trainer renders it
    assert adopted == [f"--format-prompt {tmp_path / 'format.jinja'} (data.format_prompt)",
                       "--min-pixels 262144 (experiment_config.json: data.min_pixels)",
                       "--max-pixels 4194304 (experiment_config.json: data.max_pixels)",
                       "--resize-rule easyr1 (experiment_config.json: data.min_pixels/max_pixels (EasyR1's process_image))",
                       "--max-new-tokens 2048 (experiment_config.json: data.max_response_length)",
                       "--top-p 0.95 (experiment_config.json: worker.rollout.val_override_config.top_p)",
                       "--n 1 (experiment_config.json: worker.rollout.val_override_config.n)",
                       f"--reward {reward}:compute_score (experiment_config.json: worker.reward.reward_function)",
                       '--reward-kwargs {"format_weight": 0.1} (experiment_config.json: '
                       'worker.reward.reward_function_kwargs)']  # not --temperature: given
    assert kept == []
    (tmp_path / "format.jinja").unlink()  # the Jinja file is on the training machine only: said, not adopted
    options, adopted, kept = match_training(given, training_settings(ckpt))
    assert options.format_prompt is None and not any("--format-prompt" in a for a in adopted)
    # VLM-R1's instruction as an EasyR1 Jinja format prompt: the r1 template
    _, r1_ckpt = _easyr1(tmp_path / "r1", prompt="{{ content | trim }} " + R1)
    options, adopted, kept = match_training(InferOptions(ckpt=str(r1_ckpt), explicit=frozenset()), training_settings(r1_ckpt))
    assert options.template == "r1" and adopted[0].startswith("--template r1 (") and kept == []
    (tmp_path / "r1" / "r1v.py").unlink()  # the trainer's reward file is on another machine
    options, adopted, kept = match_training(InferOptions(ckpt=str(r1_ckpt), explicit=frozenset()), training_settings(r1_ckpt))
    assert options.reward is None and options.reward_kwargs is None and not any("--reward" in a for a in adopted)
    assert kept == [f"reward (experiment_config.json: worker.reward.reward_function): {tmp_path / 'r1' / 'r1v.py'}:"
                    "compute_score: not found on this machine; pass --reward FILE.py:FUNCTION with a local copy"]


def test_match_training_from_python_treats_non_default_values_as_given(tmp_path):
    run, ckpt = _swift(tmp_path)
    options, adopted, kept = match_training(InferOptions(ckpt=str(ckpt), system="Mine."), training_settings(ckpt))
    assert options.system == "Mine." and options.generation.temperature == 1.0 and options.generation.n == 8
    assert kept == ["reward (args.json: reward_funcs): accuracy, format: the trainer's built-in reward, not a "
                    "FILE.py:FUNCTION; pass --reward FILE.py:FUNCTION with a local copy"]
    assert options.reward is None and options.reward_weights is None  # weights of a reward that is not adopted


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "im.png"
    Image.new("RGB", (56, 56), (10, 40, 90)).save(path)
    return str(path)


def test_infer_report_carries_parity_and_runs_with_the_adopted_options(tmp_path, image):
    from vlmfast.run.runner import infer

    _, ckpt = _easyr1(tmp_path)
    report = infer(InferOptions(ckpt=str(ckpt), images=[image], prompt="Q?", match_training=True,
                                explicit=frozenset({"images", "prompt"})), backend=FakeBackend())
    assert report.max_new_tokens == 2048  # the run itself got the training's max_response_length
    p = report.as_dict()["parity"]
    assert p["trainer"] == "easyr1" and p["files"] == [str(ckpt.parents[2] / "experiment_config.json")]
    assert _rows(p["rows"])["temperature"][:3] == (0.6, 0.6, True)
    by_name = {r["name"]: r for r in p["rows"]}
    assert by_name["temperature"]["evaluation_source"] == "--temperature adopted by --match-training"
    assert by_name["format_prompt"]["evaluation_source"] == f"--format-prompt {tmp_path / 'format.jinja'}"
    assert "--temperature 0.6 (experiment_config.json: worker.rollout.val_override_config.temperature)" in p["adopted"]
    assert _rows(p["rows"])["format_prompt"][2] is True and p["not_adopted"] == []
    # without --match-training: the table says what differs, and how to adopt it
    plain = infer(InferOptions(ckpt=str(ckpt), images=[image], prompt="Q?"), backend=FakeBackend()).parity
    assert plain["adopted"] == [] and plain["notes"] == [
        "evaluation differs from training in: format prompt, min pixels, max pixels, resize rule, max new tokens, temperature, top p, "
        "reward function(s), reward kwargs (--match-training adopts the training's)"]


def test_nothing_readable_beside_the_checkpoint_is_one_note(tmp_path, image):
    from vlmfast.run.runner import infer

    ckpt = _checkpoint(tmp_path / "plain")
    assert training_settings(ckpt) is None
    report = infer(InferOptions(ckpt=str(ckpt), images=[image], prompt="Q?", match_training=True), backend=FakeBackend())
    assert report.parity == {"trainer": None, "files": [], "rows": [], "adopted": [], "not_adopted": [],
                             "notes": [f"no training configuration found beside the checkpoint (looked for {LOOKED_FOR} "
                                       f"in {ckpt})"]}
    assert parity_report("hub/id", InferOptions(ckpt="hub/id"))["notes"] == [
        f"no training configuration found beside the checkpoint (looked for {LOOKED_FOR} in hub/id)"]


def test_hf_trainer_state_alone_records_no_settings(tmp_path):
    ckpt = _checkpoint(tmp_path / "out" / "checkpoint-5")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5, "max_steps": 10}))
    report = parity_report(ckpt, InferOptions(ckpt=str(ckpt)), training_settings(ckpt))
    assert report["trainer"] == "hf-trainer" and report["rows"] == []
    assert report["notes"] == [f"{ckpt / 'trainer_state.json'}: hf-trainer records no sampling or prompt settings"]


def test_cli_match_training_knows_which_options_were_given(tmp_path, image, monkeypatch):
    import vlmfast.run.runner
    from vlmfast.errors import UsageError

    seen = {}

    def capture(options, **kwargs):
        seen["options"] = options
        raise UsageError("stop here")

    monkeypatch.setattr(vlmfast.run.runner, "infer", capture)
    _, ckpt = _easyr1(tmp_path)
    result = cli("infer", "--ckpt", ckpt, "--images", image, "--prompt", "Q?", "--temperature", "0", "--top-p", "1.0",
                 "--match-training")
    assert result.returncode == 2 and "stop here" in result.stderr
    options = seen["options"]
    assert options.match_training and {"temperature", "top_p", "ckpt", "images", "prompt"} <= options.explicit
    assert "max_new_tokens" not in options.explicit and "n" not in options.explicit
    adopted, _, _ = match_training(options, training_settings(ckpt))
    assert (adopted.generation.temperature, adopted.generation.top_p, adopted.generation.max_new_tokens) == (0.0, 1.0, 2048)


def test_doctor_lists_the_settings_that_differ(tmp_path):
    from vlmfast.checkpoints.doctor import diagnose

    _, ckpt = _easyr1(tmp_path)
    found = [f for f in diagnose(ckpt, evaluation=evaluation_settings(InferOptions(ckpt=str(ckpt))))
             if f.code == "train-eval-differs"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert found[0].location == "../../../experiment_config.json"  # relative to the diagnosed dir, as doctor's are
    listed = found[0].message.removeprefix("vlmfast infer's settings differ from training in: ").split("; ")
    assert listed[0] == "format prompt (training {{ content | trim }} You FIRST think ab…, evaluation {prompt})"
    assert listed[1:7] == ["min pixels (training 262144, evaluation 3136)", "max pixels (training 4194304, evaluation 1003520)",
                           "resize rule (training easyr1, evaluation qwen)",
                           "max new tokens (training 2048, evaluation 1024)", "temperature (training 0.6, evaluation 0.0)",
                           "top p (training 0.95, evaluation 1.0)"]
    assert listed[-1] == 'reward kwargs (training {"format_weight": 0.1}, evaluation none)' and len(listed) == 9
    assert found[0].fix == f"vlmfast infer --ckpt {ckpt} --match-training (or give each setting)"
    assert not [f for f in diagnose(ckpt) if f.code == "train-eval-differs"]  # no evaluation given: no comparison
    result = cli("doctor", ckpt, "--json")
    codes = [f["code"] for f in json.loads(result.stdout)["findings"]]
    assert result.returncode == 0 and codes.count("train-eval-differs") == 1


class _SwappingFake(FakeBackend):
    def switch_to(self, found, canary=None):
        from vlmfast.engines.contract import Switched

        return Switched("swap", 0.0)


def test_sweep_reports_parity_once_from_the_run_and_adopts_it(tmp_path, image, monkeypatch):
    import vlmfast.engines.open
    from vlmfast.run.sweep import SweepOptions, sweep
    from vlmfast.run.sweep_page import write_sweep_dir

    opened = []
    monkeypatch.setattr(vlmfast.engines.open, "open_backend",
                        lambda options, *a: opened.append(options) or _SwappingFake())
    root, _ = _easyr1(tmp_path, steps=(10, 20))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "q0", "image": image, "prompt": "Q?", "solution": "A"}) + "\n")
    infer = InferOptions(ckpt=str(root), manifest=str(manifest), match_training=True, explicit=frozenset({"manifest"}))
    report = sweep(SweepOptions(run_dir=str(root), out_dir=str(tmp_path / "s"), infer=infer))
    assert [c["step"] for c in report["checkpoints"]] == [10, 20] and opened[0].generation.max_new_tokens == 2048
    assert report["settings"]["generation"]["temperature"] == 0.6 and report["settings"]["min_pixels"] == 262144
    p = report["parity"]
    assert p["trainer"] == "easyr1" and _rows(p["rows"])["max_new_tokens"][:3] == (2048, 2048, True)
    assert "--max-new-tokens 2048 (experiment_config.json: data.max_response_length)" in p["adopted"]
    write_sweep_dir(report, tmp_path / "s")
    assert json.loads((tmp_path / "s" / "report.json").read_text())["parity"] == p


def test_a_swift_repetition_penalty_against_the_checkpoint_s_and_adopted(tmp_path):
    """ms-swift's rollouts use --repetition_penalty when given (the generation config's when None); an
    evaluation applies the checkpoint's generation config's unless told: the difference is a parity row,
    and --match-training adopts the training's."""
    run, ckpt = _swift(tmp_path)
    args = json.loads((ckpt / "args.json").read_text())
    (ckpt / "args.json").write_text(json.dumps({**args, "repetition_penalty": 1.1}))
    (ckpt / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.05}))
    t = training_settings(ckpt)
    assert t.values["repetition_penalty"] == Setting(1.1, "args.json: repetition_penalty")
    rows = _rows(parity(t, InferOptions(ckpt=str(ckpt))))
    assert rows["repetition_penalty"] == (1.1, 1.05, False, "args.json: repetition_penalty")
    options, adopted, _ = match_training(InferOptions(ckpt=str(ckpt), explicit=frozenset()), t)
    assert options.generation.repetition_penalty == 1.1
    assert "--repetition-penalty 1.1 (args.json: repetition_penalty)" in adopted
    (ckpt / "args.json").write_text(json.dumps({**args, "repetition_penalty": None}))  # the generation config's
    assert "repetition_penalty" not in training_settings(ckpt).values


def test_an_adapter_s_evaluation_penalty_is_its_base_model_s(tmp_path):
    from vlmfast.run.parity import _penalty

    base, adapter = tmp_path / "base", tmp_path / "adapter"
    base.mkdir(), adapter.mkdir()
    (base / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.05}))
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    assert _penalty(None, adapter) == (1.05, "the checkpoint's generation config")
    assert _penalty(1.2, adapter) == (1.2, "--repetition-penalty")
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-VL-3B-Instruct"}))
    assert _penalty(None, adapter) == (None, "the base model's generation config (Qwen/Qwen2.5-VL-3B-Instruct: not read here)")
    assert _penalty(None, base) == (1.05, "the checkpoint's generation config")
