"""The vision tower's patch embedding as one matrix product: the convolution's values (to float rounding),
only inside the block, the module and its weight untouched; the engine's tokens stay plain generate's
(the engine and family tests hold them to it)."""

import torch

from vlmfast.engines.hf.patch_embed import linear_patch_embeds, use_linear_patch_embed


def test_the_product_gives_the_convolutions_values_and_only_inside_the_block(loaded):
    model = loaded.model
    (embed,) = linear_patch_embeds(model)
    proj = embed.proj
    torch.manual_seed(0)
    patches = torch.randn(37, proj.weight[0].numel())
    with torch.inference_mode():
        conv = embed(patches)
        calls = []
        proj.register_forward_hook(lambda *a: calls.append(1))
        with use_linear_patch_embed(model) as switched:
            product = embed(patches)
        after = embed(patches)
    assert switched == 1 and product.shape == conv.shape == (37, embed.embed_dim)
    assert torch.allclose(product, conv, rtol=1e-5, atol=1e-5)
    assert calls == [1]  # the convolution ran after the block, not inside it
    assert torch.equal(after, conv) and "forward" not in vars(embed)


def test_only_convolutions_that_are_one_product_per_patch_are_switched():
    class Embed(torch.nn.Module):
        def __init__(self, **conv):
            super().__init__()
            self.embed_dim = 8
            self.proj = torch.nn.Conv3d(3, 8, **conv)

    model = torch.nn.ModuleList([
        Embed(kernel_size=(2, 4, 4), stride=(2, 4, 4), bias=False),  # a patch embedding
        Embed(kernel_size=(2, 4, 4), stride=(1, 2, 2)),  # overlapping windows
        Embed(kernel_size=(2, 4, 4), stride=(2, 4, 4), padding=(0, 1, 1)),
        Embed(kernel_size=(2, 4, 4), stride=(2, 4, 4), dilation=(1, 2, 2)),
    ])
    assert linear_patch_embeds(model) == [model[0]]
    with use_linear_patch_embed(model) as switched:
        with use_linear_patch_embed(model) as again:  # nested: nothing switched twice
            pass
        assert "forward" in vars(model[0])
    assert (switched, again) == (1, 0) and "forward" not in vars(model[0])


def test_a_patchs_embedding_is_the_same_bits_whichever_patches_share_the_product(loaded):
    """One product over all patches of a group gave an image's patches other last bits than the product over its
    own (BLAS picks its kernel by the row count), and a tied greedy token flipped with the batch: every product
    now has the same row count."""
    from vlmfast.engines.hf import patch_embed

    (embed,) = linear_patch_embeds(loaded.model)
    torch.manual_seed(0)
    patches = torch.randn(3000, embed.proj.weight[0].numel())
    with torch.inference_mode(), use_linear_patch_embed(loaded.model):
        whole = embed(patches)
        for start, count in ((0, 24), (2000, 24), (1020, 9), (2990, 10), (100, patch_embed.ROWS + 5)):
            assert torch.equal(embed(patches[start:start + count]), whole[start:start + count]), (start, count)
