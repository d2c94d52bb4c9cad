"""The read-back after an in-place vLLM reload, against a stand-in engine whose one worker holds a loaded
model (vLLM's own workers run the same function through ``collective_rpc``): equal weights pass, weights
that did not land are named, an engine that cannot answer is no evidence."""

import pytest

from vlmfast.engines.vllm.reload import readback_picks, reloaded_mismatch, worker_digests


class _Worker:
    def __init__(self, model):
        self.model_runner = type("Runner", (), {"model": model})()


class _Llm:
    def __init__(self, model=None, fails=False):
        self.worker, self.fails = _Worker(model), fails

    def collective_rpc(self, method, args=()):
        if self.fails:
            raise AttributeError("no such rpc")
        return [method(self.worker, *args)]


@pytest.fixture(scope="module")
def pair(grpo_ckpt, tmp_path_factory):
    import torch
    from safetensors.torch import load_file, save_file

    from vlmfast.checkpoints.load import load

    other = tmp_path_factory.mktemp("readback") / "trained"
    import shutil

    shutil.copytree(grpo_ckpt, other)
    tensors = load_file(other / "model.safetensors")
    for name in [n for n in tensors if n.endswith("norm.weight") and "visual" not in n]:
        tensors[name] = tensors[name] + torch.linspace(0, 0.1, tensors[name].numel())  # training moved the norms
    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
    return load(str(grpo_ckpt), device="cpu"), other


def test_the_weights_the_engine_holds_pass_and_stale_ones_are_named(pair, grpo_ckpt):
    loaded, other = pair
    picks = readback_picks(other)
    assert 1 <= len(picks) <= 3 and all("norm.weight" in name for _, name in picks.values())
    assert reloaded_mismatch(_Llm(loaded.model), grpo_ckpt) is None  # it holds what the files say
    wrong = reloaded_mismatch(_Llm(loaded.model), other)  # a reload of `other` that never landed
    assert wrong is not None and "holds other values in the engine than trained/model.safetensors" in wrong


def test_an_engine_that_cannot_answer_is_no_evidence(pair):
    loaded, other = pair
    assert reloaded_mismatch(_Llm(fails=True), other) is None
    assert set(worker_digests(_Worker(loaded.model), list(readback_picks(other)))) == set(readback_picks(other))
