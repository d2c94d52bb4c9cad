"""LoRA adapter checkpoints resumed after their adapter file was saved over: refused by infer and evaluated
again by a sweep, as full checkpoints whose weight files changed are (test_runner, test_sweep)."""

import json
import shutil

import pytest

from conftest import read_jsonl, retrain_adapter
from vlmfast.engines.rows import GenerationSettings
from vlmfast.run.options import InferOptions
from vlmfast.run.runner import infer

SETTINGS = GenerationSettings(max_new_tokens=6)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters on one base: an ms-swift LoRA checkpoint, and a copy whose weights were trained further."""
    from layouts import build_layout

    lora = build_layout(tmp_path_factory.mktemp("lora") / "swift-lora", "swift-lora")
    other = shutil.copytree(lora.model_dir, tmp_path_factory.mktemp("adapters") / "other")
    retrain_adapter(other / "adapter_model.safetensors")
    return {"one": lora.model_dir, "other": other, "base": lora.base}


def _infer_options(ckpt, images, out, **kw):
    return InferOptions(ckpt=str(ckpt), images=[str(p) for p in images], prompt="Count.", out=str(out),
                        generation=SETTINGS, device="cpu", **kw)


def _tokens(rows):
    return [(r["id"], r["text"], r["n_new_tokens"]) for r in rows]


def test_a_resume_onto_rows_another_adapter_made_is_refused(adapters, images, tmp_path):
    from vlmfast.errors import UsageError

    ckpt = shutil.copytree(adapters["one"], tmp_path / "ckpt")
    out = tmp_path / "r.jsonl"
    report = infer(_infer_options(ckpt, images[:2], out))
    recorded = json.loads(out.with_name("r.run.json").read_text())
    assert recorded["fingerprint"] == report.fingerprint["digest"]
    assert report.fingerprint["base"]["digest"] and str(adapters["base"]) in recorded["fingerprint_of"]
    shutil.copy(adapters["other"] / "adapter_model.safetensors", ckpt / "adapter_model.safetensors")
    with pytest.raises(UsageError, match="holds rows made from other weights") as caught:
        infer(_infer_options(ckpt, images[:4], out))
    assert "--overwrite" in caught.value.hint and len(read_jsonl(out)) == 2
    assert infer(_infer_options(ckpt, images[:4], out, overwrite=True)).samples == 4


def test_a_resumed_sweep_evaluates_again_a_step_whose_adapter_changed(adapters, images, tmp_path):
    from vlmfast.checkpoints.fingerprint import weights_fingerprint
    from vlmfast.checkpoints.locate import locate
    from vlmfast.run.sweep import SweepOptions, sweep

    run, out = tmp_path / "run", tmp_path / "out"
    shutil.copytree(adapters["one"], run / "checkpoint-100")
    shutil.copytree(adapters["other"], run / "checkpoint-300")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Count.", "solution": "3",
                                            "scorer": "exact"}) + "\n" for i, p in enumerate(images[:3])))
    options = SweepOptions(run_dir=str(run), out_dir=str(out), infer=InferOptions(
        ckpt=str(run), manifest=str(manifest), generation=SETTINGS, device="cpu"))
    report = sweep(options)
    digests = {c["step"]: c["fingerprint"] for c in report["checkpoints"]}
    assert None not in digests.values() and len(set(digests.values())) == 2
    assert digests[100] == weights_fingerprint(locate(run / "checkpoint-100"))["digest"]
    record = json.loads((out / "step-100.run.json").read_text())
    assert record["fingerprint"] == digests[100] and str(adapters["base"]) in record["fingerprint_of"]
    rows = {c["step"]: read_jsonl(c["results"]) for c in report["checkpoints"]}
    assert _tokens(rows[100]) != _tokens(rows[300])  # the two adapters answer differently
    again = sweep(options)  # nothing changed: read back, nothing redone
    assert [c["fingerprint"] for c in again["checkpoints"]] == list(digests.values())
    assert not any("changed since" in n for n in again["notes"])
    # the adapter file saved over in place (adapter_config.json and the base unchanged)
    shutil.copy(run / "checkpoint-300" / "adapter_model.safetensors", run / "checkpoint-100" / "adapter_model.safetensors")
    redone = sweep(options)
    [said] = [n for n in redone["notes"] if "changed since" in n and "step-100.jsonl" in n]
    [aside] = list(out.glob("replaced-*"))  # the earlier rows are kept, not deleted
    assert said.endswith(f"(the earlier rows are in {aside})")
    by_step = {c["step"]: c for c in redone["checkpoints"]}
    assert by_step[100]["fingerprint"] == digests[300]
    assert (f"steps 100, 300 have identical weights (fingerprint {digests[300]}): the same model saved twice, or a copy"
            in redone["notes"]) and not any("identical weights" in n for n in report["notes"])
    assert _tokens(read_jsonl(by_step[100]["results"])) == _tokens(rows[300])  # its rows are the new adapter's
