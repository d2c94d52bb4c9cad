"""An ``lm_head.weight`` saved while config.json ties the head to the embedding: transformers 4.57 ties and
discards the saved head, 5.x keeps it. doctor says so (error when the head differs from the embedding, info
when it is the embedding's copy); infer runs the saved head on either line, so its greedy tokens are those of
the untied checkpoint the trainer ran; the vLLM engine and an in-place swap into a tied model refuse it.
Real layouts raise nothing: Qwen2.5-VL-3B (tied, no head saved), 7B (untied, head saved)."""

import json
import shutil

import pytest

from conftest import cli, edit_json

TOP, TEXT = "config.json: tie_word_embeddings", "config.json: text_config.tie_word_embeddings"


def _tied(src, dst, top=True, text=True, head=None):
    """A copy of ``src`` whose config.json ties the head (``top``: at the top level, ``text``: in text_config);
    ``head``: "embedding" saves the embedding's values as the head, "drop" saves none."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    edit_json(dst / "config.json", lambda c: (c.update(tie_word_embeddings=top),
                                              c["text_config"].update(tie_word_embeddings=text)))
    if head is not None:
        state = load_file(dst / "model.safetensors")
        embedding = next(k for k in state if k.endswith("embed_tokens.weight") and "visual" not in k)
        if head == "drop":
            state.pop("lm_head.weight")
        else:
            state["lm_head.weight"] = state[embedding].clone()
        save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _head_findings(d):
    from vlmfast.checkpoints.doctor import diagnose

    return [f for f in diagnose(d) if f.code == "tied-head-saved"]


@pytest.mark.parametrize("top,text,where", [(True, True, [TOP, TEXT]), (False, True, [TEXT]), (True, False, [TOP])])
def test_a_differing_saved_head_under_a_tie_is_an_error_wherever_the_tie_is(grpo_ckpt, tmp_path, top, text, where):
    (f,) = _head_findings(_tied(grpo_ckpt, tmp_path / "tied", top, text))
    assert f.severity == "error" and f.location == ", ".join(where)
    assert "hold lm_head.weight with other values than model.embed_tokens.weight" in f.message
    v4 = ("transformers 4.57 ties the head to the embedding and silently discards the saved one" if text
          else "transformers 4.57 reads text_config's false and keeps it")
    assert v4 in f.message
    assert "transformers 5.x keeps the saved head" in f.message
    assert "vlmfast infer runs the saved head on either transformers line" in f.message
    assert f.fix.startswith("if the head was trained as its own matrix") and "set tie_word_embeddings to false" in f.fix
    assert "drop lm_head.weight" in f.fix


def test_doctor_strict_exits_1_on_it(grpo_ckpt, tmp_path):
    r = cli("doctor", _tied(grpo_ckpt, tmp_path / "tied"), "--json", "--strict")
    assert r.returncode == 1 and "tied-head-saved" in {f["code"] for f in json.loads(r.stdout)["findings"]}


def test_a_saved_copy_of_the_embedding_is_info_and_no_head_or_no_tie_is_nothing(grpo_ckpt, tmp_path):
    (f,) = _head_findings(_tied(grpo_ckpt, tmp_path / "copy", head="embedding"))
    assert f.severity == "info" and "with the exact values of model.embed_tokens.weight" in f.message
    assert _head_findings(_tied(grpo_ckpt, tmp_path / "none", head="drop")) == []  # tied as save_pretrained saves it
    assert _head_findings(grpo_ckpt) == []  # untied, head saved (the 7B layout)


def _qwen25_vl_shaped(grpo_ckpt, d, preset, tied):
    """The published Qwen2.5-VL shapes of ``preset`` as headers over sparse files (no data): the 3B ties its head
    and saves none, the 7B saves its own."""
    from test_weights import _header_only_shards

    from vlmfast.checkpoints.tiny import PRESETS
    from vlmfast.checkpoints.expected import expected_tensors

    shutil.copytree(grpo_ckpt, d)
    (d / "model.safetensors").unlink()
    config = json.loads((d / "config.json").read_text())
    spec = PRESETS[preset]
    text = {k: v for k, v in spec["text"].items() if k != "mrope_section"}
    config["text_config"].update(text, vocab_size=spec["vocab_size"], tie_word_embeddings=tied)
    config["text_config"].pop("layer_types", None)
    config["text_config"]["rope_scaling"] = {"type": "mrope", "mrope_section": spec["text"]["mrope_section"]}
    config.update({k: v for k, v in text.items() if k in config}, tie_word_embeddings=tied)
    config["vision_config"].update(spec["vision"], out_hidden_size=text["hidden_size"])
    (d / "config.json").write_text(json.dumps(config))
    expected = expected_tensors(d, config)
    assert expected.tied_head == tied
    saved = {n.replace("model.language_model.", "model.").replace("model.visual.", "visual."): shape
             for n, shape in expected.tensors.values() if not (tied and n == "lm_head.weight")}
    _header_only_shards(d, saved)
    return d


@pytest.mark.parametrize("preset,tied", [("3b", True), ("7b", False)])
def test_real_layouts_raise_nothing(grpo_ckpt, tmp_path, preset, tied):
    from vlmfast.checkpoints.doctor import diagnose
    from vlmfast.checkpoints.tiny import PRESETS

    if preset not in PRESETS:
        pytest.skip(f"no {preset} preset")
    d = _qwen25_vl_shaped(grpo_ckpt, tmp_path / preset, preset, tied)
    codes = {f.code for f in diagnose(d)}
    assert "tied-head-saved" not in codes and not {c for c in codes if c.startswith("weights-")}


def _texts(out):
    return [json.loads(line)["text"] for line in out.read_text().splitlines()]


def test_infer_runs_the_saved_head_the_trainer_ran_on_this_transformers_line(grpo_ckpt, images, tmp_path):
    """Greedy tokens of the tied-config copy equal the untied original's (on 4.57 they differed: it ran the
    embedding as the head), and a note says what was done."""
    tied = _tied(grpo_ckpt, tmp_path / "tied")
    args = ("--images", images[0], images[1], "--prompt", "Count.", "--max-new-tokens", "8", "--device", "cpu", "--json")
    r = cli("infer", "--ckpt", grpo_ckpt, *args, "--out", tmp_path / "a.jsonl")
    assert r.returncode == 0
    r = cli("infer", "--ckpt", tied, *args, "--out", tmp_path / "b.jsonl")
    assert r.returncode == 0
    assert _texts(tmp_path / "b.jsonl") == _texts(tmp_path / "a.jsonl")
    notes = [n for n in json.loads(r.stdout)["notes"] if "lm_head.weight is saved with its own values" in n]
    assert len(notes) == 1 and "so the trainer ran that head" in notes[0]


def test_the_loaded_head_is_the_saved_one_and_not_the_embedding(grpo_ckpt, tmp_path):
    import torch
    from safetensors.torch import load_file

    from vlmfast.checkpoints.load import load

    tied = _tied(grpo_ckpt, tmp_path / "tied")
    model = load(str(tied), device="cpu").model
    head, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head is not embedding
    assert torch.equal(head.to(torch.float32), load_file(tied / "model.safetensors")["lm_head.weight"].to(torch.float32))
    model.tie_weights()  # the config no longer ties: tying again later keeps the saved head
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    # a copy of the embedding saved as the head: nothing to change, no note
    copy = load(str(_tied(grpo_ckpt, tmp_path / "copy", head="embedding")), device="cpu")
    assert not [n for n in copy.notes if "lm_head.weight" in n]


def test_the_vllm_engine_refuses_it_before_starting(grpo_ckpt, images, tmp_path):
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.weights import require_whole
    from vlmfast.errors import CheckpointError

    tied = _tied(grpo_ckpt, tmp_path / "tied")
    assert require_whole(locate(tied)).whole  # the HF engine runs it
    with pytest.raises(CheckpointError, match="vLLM would run the embedding as the head instead") as exc:
        require_whole(locate(tied), engine="vllm")
    assert "set tie_word_embeddings to false" in exc.value.hint and "--engine hf" in exc.value.hint
    require_whole(locate(_tied(grpo_ckpt, tmp_path / "copy", head="embedding")), engine="vllm")  # equal: fine
    out = tmp_path / "rows.jsonl"
    r = cli("infer", "--ckpt", tied, "--images", images[0], "--prompt", "Count.", "--engine", "vllm", "--out", out)
    assert r.returncode == 2 and not out.exists() and "vLLM would run the embedding" in r.stderr


def test_an_in_place_swap_into_a_tied_model_is_refused(grpo_ckpt, tmp_path):
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.swap import plan_swap

    loaded = load(str(_tied(grpo_ckpt, tmp_path / "tied-none", head="drop")), device="cpu")
    plan = plan_swap(loaded, _tied(grpo_ckpt, tmp_path / "tied"))
    assert plan.files is None and "LM head of its own" in plan.reason
    assert plan_swap(loaded, _tied(grpo_ckpt, tmp_path / "copy", head="embedding")).files is not None


def test_a_saved_head_is_compared_with_the_embedding_by_windows_not_whole(tmp_path, monkeypatch):
    """A 3B model's embedding and head are 1.2 GB together: doctor, every load and every swap compare them
    by 16 windows of 64 KiB; a trained head differs from the embedding everywhere, a merger's copy nowhere."""
    import builtins
    import os

    from vlmfast.checkpoints import heads

    data = os.urandom(8 << 20)
    (tmp_path / "a").write_bytes(data)
    (tmp_path / "b").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # differs in its last byte only
    read, real_open = [], builtins.open

    def counting(*args, **kw):
        f = real_open(*args, **kw)
        real_read = f.read
        f.read = lambda n=-1: (lambda out: (read.append(len(out)), out)[1])(real_read(n))
        return f

    monkeypatch.setattr(builtins, "open", counting)
    a, b = (str(tmp_path / "a"), "BF16", [4 << 20], 0, 8 << 20), (str(tmp_path / "b"), "BF16", [4 << 20], 0, 8 << 20)
    assert heads._same(a, a) and not heads._same(a, b)
    assert sum(read) <= 2 * 2 * (heads.SAMPLES + 1) * heads.CHUNK  # two comparisons, two files each
