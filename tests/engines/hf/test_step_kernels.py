"""The compiled decode step is one graph for every family, and a decoder layer adds few kernels to it."""

import pytest

from vlmfast.checkpoints.families import BY_KEY
from vlmfast.engines.hf.step_kernels import count_kernels


def _has_class(key: str) -> bool:
    import transformers

    return hasattr(transformers, BY_KEY[key].model_class)


FAMILIES = [pytest.param(k, marks=pytest.mark.skipif(not _has_class(k), reason="not in this transformers"))
            for k in BY_KEY]


@pytest.mark.parametrize("key", FAMILIES)
def test_the_compiled_decode_step_has_no_graph_break(key, family_ckpts):
    """A graph break would split the step and run what lies between in Python, kernel by kernel: the
    layers, and the choice of the next token (greedy; a seeded draw with nucleus filtering) in one graph."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.step_kernels import graph_breaks

    model = load(str(family_ckpts(key)), device="cpu").model
    assert graph_breaks(model) == 0
    if key == "qwen2_5_vl":
        assert graph_breaks(model, temperature=0.7, top_p=0.9) == 0
        assert graph_breaks(model, penalty=1.05) == 0  # the checkpoint's repetition penalty, inside the step


def test_a_decoder_layer_adds_at_most_eight_generated_kernels_and_one_product_per_projection_group(family_ckpts,
                                                                                                    monkeypatch):
    """Counted in inductor's code for the step (CPU here: the proxy of a GPU's kernels): norms fused with
    the residual adds, rotary positions with the cache writes and attention's mask; Q/K/V one product,
    gate/up one product, then attention, the output projection and down: five library calls."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.step_kernels import per_layer

    monkeypatch.delenv("VLMFAST_DECODE_ATTENTION", raising=False)  # the default attention: SDPA, one library call
    counted = per_layer(load(str(family_ckpts("qwen2_5_vl")), device="cpu").model, "qwen2_5_vl")
    assert counted.graph_breaks == 0
    assert counted.generated <= 8 and counted.library == 5, counted.line()


def test_kernel_calls_are_read_from_inductors_code_for_a_cpu_and_a_gpu():
    cpu = '''
def kernel_body(): pass
def call(self, args):
    buf0 = empty_strided_cpu((4, 256), (256, 1), torch.float32)
    cpp_fused_add_mean_mul_pow_rsqrt_0(arg6_1, buf0)
    extern_kernels.mm(buf0, arg1_1, out=buf2)
    buf23 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(buf21, arg15_1, arg16_1)
    cpp_fused_mul_silu_1(buf2)
    return (buf2, )
'''
    gpu = '''
def call(args):
        triton_red_fused_add_mean_0.run(arg0_1, buf0, 4, 256, stream=stream0)
        extern_kernels.mm(buf0, arg1_1, out=buf1)
        triton_poi_fused_mul_silu_1.run(buf1, 1024, stream=stream0)
'''
    assert count_kernels([cpu]) == (2, 2)
    assert count_kernels([gpu]) == (2, 1)
    assert count_kernels([cpu, gpu]) == (4, 3)


def test_the_penalty_in_a_compiled_step_is_one_opaque_operator_with_eager_s_quotients():
    """On CUDA inductor would turn ``logits / 1.05`` into a product with the reciprocal (and Triton divides
    approximately): a last-bit difference from generate's quotient that can flip a near-tie. The compiled
    graph calls the operator instead, whose kernels are eager's."""
    import torch

    from vlmfast.engines.hf.sampling import penalize

    targets = []

    def backend(gm, inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    logits, seen = torch.randn(4, 300), torch.rand(4, 300) > 0.5
    chosen = torch.compile(lambda x, s: penalize(x, s, 1.05).argmax(-1), backend=backend, fullgraph=True)(logits, seen)
    assert "vlmfast.repetition_penalty.default" in targets and not any("truediv" in t for t in targets)
    assert torch.equal(chosen, penalize(logits, seen, 1.05).argmax(-1))
