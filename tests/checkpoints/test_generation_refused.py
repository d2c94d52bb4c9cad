"""generation_config.json values transformers refuses (its loading, or plain generate) or misreads: the rules
held to what the installed transformers does, and doctor, fix and infer on them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import cli, edit_json
from vlmfast.checkpoints.doctor import diagnose
from vlmfast.checkpoints.generation_refused import refused_values

# values a trainer or a merge script writes, and where transformers (4.57.6 and 5.24) refuses them
LOAD = {  # GenerationConfig, and so the model's from_pretrained, raise
    "early_stopping": {"early_stopping": "true"},
    "max_new_tokens": {"max_new_tokens": 0},
    "max_new_tokens-string": {"max_new_tokens": "1024"},
    "pad_token_id": {"pad_token_id": "<|endoftext|>"},
    "num_return_sequences": {"num_return_sequences": 2},
    "num_return_sequences-beams": {"num_beams": 2, "num_return_sequences": 4},
    "num_return_sequences-no-beams": {"num_beams": 0, "do_sample": True, "num_return_sequences": 4},
    "cache_implementation": {"cache_implementation": "vllm"},
    "compile_config": {"compile_config": {"fullgraph": True}},
    "watermarking_config": {"watermarking_config": {"strength": 1}},
    "synced_gpus": {"synced_gpus": True},
}
GENERATE = {  # the model loads; plain generate raises before the first token
    "num_beams": {"num_beams": 0},
    "num_beams-float": {"num_beams": 2.5},
    "bos_token_id": {"bos_token_id": "<|endoftext|>"},
    "repetition_penalty": {"repetition_penalty": 0},
    "repetition_penalty-string": {"repetition_penalty": "1.05"},
    "temperature": {"do_sample": True, "temperature": "0.7"},
    "top_k": {"do_sample": True, "top_k": 50.0},
    "typical_p": {"do_sample": True, "typical_p": 0},
    "min_p": {"do_sample": True, "min_p": 2},
    "stop_strings": {"stop_strings": ["</answer>"]},  # unless generate is given tokenizer=
    "no_repeat_ngram_size": {"no_repeat_ngram_size": "3"},
    "min_length": {"min_length": "2"},
    "epsilon_cutoff": {"do_sample": True, "epsilon_cutoff": "0.0003"},
}
HARMLESS = {"num_beams": 1.0, "top_k": 0, "top_p": 1.5, "pad_token_id": -1, "length_penalty": 2.0,
            "cache_implementation": "hybrid", "reward_funcs": ["accuracy"], "beta": 0.04}


@pytest.fixture(scope="module")
def plain_model(base_ckpt):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(base_ckpt))


def _saved(base_ckpt, values) -> dict:
    return {**json.loads((base_ckpt / "generation_config.json").read_text()), **values}


def _plain_generate(model, generation: dict):
    """New tokens from plain ``generate`` with ``generation`` as the model's generation config (a short prompt)."""
    import torch
    from transformers import GenerationConfig

    kept = model.generation_config
    model.generation_config = GenerationConfig.from_dict(generation)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    try:
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3).shape[1] - 5
    finally:
        model.generation_config = kept


@pytest.mark.parametrize("case", sorted(LOAD))
def test_what_transformers_refuses_to_load_is_a_load_rule(base_ckpt, case):
    from transformers import GenerationConfig

    values = _saved(base_ckpt, LOAD[case])
    with pytest.raises((ValueError, TypeError)):
        GenerationConfig.from_dict(values)
    assert "load" in {r.rule.stage for r in refused_values(values)}


@pytest.mark.parametrize("case", sorted(GENERATE))
def test_what_plain_generate_refuses_is_a_generate_rule(base_ckpt, plain_model, case):
    values = _saved(base_ckpt, GENERATE[case])
    with pytest.raises((ValueError, TypeError, ZeroDivisionError)):
        _plain_generate(plain_model, values)
    assert {r.rule.stage for r in refused_values(values)} == {"tokenizer" if case == "stop_strings" else "generate"}


def test_harmless_values_are_no_finding_and_generate_runs(base_ckpt, plain_model, tmp_path):
    values = _saved(base_ckpt, HARMLESS)
    assert refused_values(values) == []
    assert _plain_generate(plain_model, values) == 3
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(HARMLESS))
    assert diagnose(d) == []


def test_a_do_sample_string_samples_and_is_a_warning(base_ckpt, plain_model, tmp_path):
    """generate samples for any true do_sample: the string "false" draws what true draws (transformers says
    nothing; 5.24 names the mode greedy and still draws in its loop), not greedy's tokens."""
    import torch
    from transformers import GenerationConfig

    def tokens(do_sample):
        kept = plain_model.generation_config
        plain_model.generation_config = GenerationConfig.from_dict({"do_sample": do_sample})
        torch.manual_seed(0)
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        try:
            return plain_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8)[0].tolist()
        finally:
            plain_model.generation_config = kept

    assert tokens("false") == tokens(True) != tokens(False)
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(do_sample="false"))
    found = [(f.severity, f.code, f.location) for f in diagnose(d)]
    assert found == [("warning", "generation-value-misread", "generation_config.json: do_sample")]
    assert cli("fix", d).returncode == 0
    assert json.loads((d / "generation_config.json").read_text())["do_sample"] is False
    edit_json(d / "generation_config.json", lambda c: c.update(do_sample="true"))  # samples, as it says
    assert diagnose(d) == []


def test_doctor_names_each_refused_value(base_ckpt, tmp_path):
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(early_stopping="true", num_beams=0, min_p=2,
                                                               do_sample=True, stop_strings=["</answer>"]))
    found = {f.location: f for f in diagnose(d)}
    said = {k.split(": ")[1]: (f.severity, f.code) for k, f in found.items()}
    refused = "generation-value-refused"
    assert said == {"early_stopping": ("error", refused), "num_beams": ("error", refused), "min_p": ("error", refused),
                    "stop_strings": ("warning", refused)}
    early = found["generation_config.json: early_stopping"]
    assert early.message.startswith("early_stopping 'true': transformers refuses to load the config")
    assert early.fix == f"vlmfast fix {d} (early_stopping 'true' -> True)"
    assert found["generation_config.json: min_p"].fix.startswith("edit generation_config.json: a number in [0, 1]")


def test_fix_repairs_what_has_one_repair_and_says_what_is_left(base_ckpt, plain_model, tmp_path):
    from transformers import GenerationConfig

    d = shutil.copytree(base_ckpt, tmp_path / "c")
    bad = {"early_stopping": "false", "max_new_tokens": "1024", "pad_token_id": "<|endoftext|>", "num_beams": 0,
           "do_sample": True, "temperature": "0.7", "top_k": 50.0, "repetition_penalty": "1.05",
           "cache_implementation": "vllm", "synced_gpus": True, "watermarking_config": {"strength": 1}}
    edit_json(d / "generation_config.json", lambda c: c.update(bad))
    r = cli("fix", d)
    assert r.returncode == 1  # an error is left: the watermarking config has no one repair
    assert "fixed: generation_config.json: max_new_tokens '1024' -> 1024 (transformers refuses it)" in r.stderr
    assert "fixed: generation_config.json: num_beams dropped (plain generate refuses it)" in r.stderr
    assert "not fixed: generation-value-refused (generation_config.json: watermarking_config)" in r.stderr
    gen = json.loads((d / "generation_config.json").read_text())
    assert json.loads((d / "generation_config.json.orig").read_text())["num_beams"] == 0
    assert {k: gen.get(k) for k in bad} == {
        "early_stopping": False, "max_new_tokens": 1024, "pad_token_id": 664, "num_beams": None, "do_sample": True,
        "temperature": 0.7, "top_k": 50, "repetition_penalty": 1.05, "cache_implementation": None, "synced_gpus": None,
        "watermarking_config": {"strength": 1}}
    del gen["watermarking_config"]  # the user's edit
    (d / "generation_config.json").write_text(json.dumps(gen))
    assert diagnose(d) == []
    GenerationConfig.from_pretrained(str(d))  # loads
    assert _plain_generate(plain_model, gen) == 3


def test_a_repair_that_makes_another_value_refused_is_followed_by_its_repair(base_ckpt, tmp_path):
    """do_sample "false" samples, so transformers loads num_return_sequences 2 beside it; made false, greedy
    refuses the 2: fix judged every value on the file as it was, and left a checkpoint that no longer loads."""
    from transformers import GenerationConfig

    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(do_sample="false", num_return_sequences=2))
    r = cli("fix", d)
    assert r.returncode == 0, r.stderr
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["do_sample"] is False and "num_return_sequences" not in gen
    GenerationConfig.from_pretrained(str(d))  # loads
    assert diagnose(d) == []


# (values, the stages each line's rules give): read in both lines' configuration_utils.py and generation/utils.py
BY_LINE = [
    ({"pad_token_id": 664.0}, [], []),  # validate compares it with 0; generate makes a long tensor of it
    ({"bos_token_id": 664.0}, [], []),
    ({"_from_model_config": True, "synced_gpus": True}, [], []),  # such a config sets no key it does not know
    ({"synced_gpus": None}, ["load"], ["load"]),  # validate asks hasattr: a null is set too
    ({"early_stopping": None}, ["load"], []),  # 4.57: None is not in {True, False, "never"}
    ({"num_return_sequences": None}, ["load"], []),  # 4.57: None != 1, and greedy by default
    ({"do_sample": None, "num_return_sequences": 2}, [], ["load"]),  # 4.57 asks do_sample is False, 5.x not do_sample
    ({"num_return_sequences": "1"}, ["load"], ["load"]),  # a string compared with a number
    ({"num_return_sequences": 0}, ["load"], []),  # 4.57: any value but 1 without beams or sampling
    ({"do_sample": "yes"}, [], []),  # samples, as it says
]


@pytest.mark.parametrize("values,on_4,on_5", BY_LINE)
def test_the_rules_judge_each_line_as_its_source_does(base_ckpt, values, on_4, on_5):
    """The rules for either line, and for the installed one what its GenerationConfig really does."""
    import transformers
    from transformers import GenerationConfig

    saved = _saved(base_ckpt, values)
    assert ([r.rule.stage for r in refused_values(saved, major=4)], [r.rule.stage for r in refused_values(saved, major=5)]) \
        == (on_4, on_5)
    expected = on_4 if int(transformers.__version__.split(".")[0]) < 5 else on_5
    if "load" in expected:
        with pytest.raises((ValueError, TypeError)):
            GenerationConfig.from_dict(saved)
    else:
        GenerationConfig.from_dict(saved)


def test_sampling_at_temperature_zero_is_found_with_do_sample_written_as_a_string(base_ckpt, tmp_path):
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(do_sample="true", temperature=0))
    assert [f.code for f in diagnose(d) if f.severity == "error"] == ["sampling-temperature-zero"]


@pytest.mark.parametrize("decoder", ["vlmfast", "hf"])
def test_infer_refuses_what_transformers_cannot_load_naming_file_key_value(base_ckpt, images, tmp_path, decoder):
    """Was: "cannot load the model (ValueError: `early_stopping` must be …)" with a hint about the weights."""
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(early_stopping="true", watermarking_config={"strength": 1}))
    out = tmp_path / "out.jsonl"
    r = cli("infer", "--ckpt", d, "--images", images[0], "--prompt", "Hi.", "--out", out, "--decoder", decoder)
    assert r.returncode == 2 and not out.exists()
    assert (f"error: {d / 'generation_config.json'}: early_stopping 'true', watermarking_config {{'strength': 1}}: "
            "transformers refuses to load the config") in r.stderr
    assert f"hint: vlmfast fix {d} (early_stopping 'true' -> True); edit {d / 'generation_config.json'} " \
           "(watermarking_config: remove it" in r.stderr


def _answers(ckpt, images, out, *options) -> tuple[list[str], str]:
    r = cli("infer", "--ckpt", ckpt, "--images", *images[:2], "--prompt", "Hi.", "--max-new-tokens", "6",
            "--out", out, *options)
    assert r.returncode == 0, r.stderr
    return [json.loads(line)["text"] for line in out.read_text().splitlines()], r.stderr


@pytest.mark.parametrize("options", [("--decoder", "hf"), ("--decoder", "hf", "--temperature", "0.8", "--seed", "3"),
                                     ("--decoder", "vlmfast")])
def test_infer_runs_what_plain_generate_refuses_on_its_own_settings(base_ckpt, images, tmp_path, options):
    """--decoder hf raised (ZeroDivisionError for num_beams 0, "Greedy methods …" for num_return_sequences beside
    vlmfast's greedy do_sample, a stop-string ValueError, a tensor of a string BOS): both decoders give the
    clean checkpoint's tokens, and say what they did not apply."""
    refused = shutil.copytree(base_ckpt, tmp_path / "refused")
    edit_json(refused / "generation_config.json", lambda c: c.update(
        num_beams=0, bos_token_id="<|endoftext|>", stop_strings=["</answer>"], do_sample=True, typical_p=0, top_k=50.0))
    numbers = shutil.copytree(base_ckpt, tmp_path / "numbers")  # settings generate applies, as strings
    edit_json(numbers / "generation_config.json", lambda c: c.update(no_repeat_ngram_size="3", min_length="2"))
    several = shutil.copytree(base_ckpt, tmp_path / "several")  # loads and generates (sampling), but not greedily
    edit_json(several / "generation_config.json", lambda c: c.update(do_sample=True, num_return_sequences=4))
    clean, _ = _answers(base_ckpt, images, tmp_path / "clean.jsonl", *options)
    answers, said = _answers(refused, images, tmp_path / "refused.jsonl", *options)
    assert answers == clean
    assert "generation_config.json sets num_beams 0, bos_token_id '<|endoftext|>', top_k 50.0, typical_p 0, " \
           "stop_strings ['</answer>'], which plain generate refuses or misreads" in " ".join(said.split())
    assert _answers(several, images, tmp_path / "several.jsonl", *options)[0] == clean
    answers, said = _answers(numbers, images, tmp_path / "numbers.jsonl", *options)
    assert answers == clean and "sets no_repeat_ngram_size '3', min_length '2', which plain generate refuses" in said


def test_infer_refuses_a_repetition_penalty_that_is_no_number_above_zero(base_ckpt, images, tmp_path):
    """vlmfast applied -1 (and took 0 as none) where plain generate refuses both; --repetition-penalty decides."""
    d = shutil.copytree(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.update(repetition_penalty=-1.0))
    out = tmp_path / "out.jsonl"
    r = cli("infer", "--ckpt", d, "--images", images[0], "--prompt", "Hi.", "--out", out, "--max-new-tokens", "2")
    assert r.returncode == 2 and not out.exists()
    assert f"error: {d / 'generation_config.json'}: repetition_penalty -1.0: plain generate refuses it" in r.stderr
    assert "hint: pass --repetition-penalty (1: none)" in r.stderr
    r = cli("infer", "--ckpt", d, "--images", images[0], "--prompt", "Hi.", "--out", out, "--max-new-tokens", "2",
            "--repetition-penalty", "1")
    assert r.returncode == 0, r.stderr


def test_the_rules_import_neither_torch_nor_transformers(base_ckpt):
    code = ("import sys\nfrom vlmfast.checkpoints.generation_refused import refused_findings\n"
            "found = refused_findings({}, {'num_beams': 0, 'early_stopping': 'yes'}, 'vlmfast fix X')\n"
            "print(len(found), 'torch' in sys.modules, 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False", "False"], r.stderr


@pytest.mark.parametrize("values", [{"cache_implementation": "paged"}, {"use_model_defaults": True}])
def test_a_value_one_line_refuses_is_judged_for_the_installed_line(base_ckpt, values):
    """5.x knows the "paged" cache and takes use_model_defaults as an unknown key; 4.57 refuses both on load."""
    import transformers
    from transformers import GenerationConfig

    saved = _saved(base_ckpt, values)
    if int(transformers.__version__.split(".")[0]) < 5:
        with pytest.raises(ValueError):
            GenerationConfig.from_dict(saved)
        assert [r.rule.stage for r in refused_values(saved)] == ["load"]
    else:
        GenerationConfig.from_dict(saved)
        assert refused_values(saved) == []
