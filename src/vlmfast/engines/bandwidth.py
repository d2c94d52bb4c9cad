"""How close to the hardware a decode runs: the model's decode shape and achieved memory bandwidth.

Decode is memory-bound: every step reads the language model's weights once plus each sequence's KV
cache. Bytes moved per step ÷ step time is the achieved bandwidth; against the device's peak it says
how much headroom is left (gpt-fast reports the same figure). Pure arithmetic on config numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# Peak HBM bandwidth in GB/s by device-name fragment (vendor datasheets); first match wins, so more
# specific names come first. Unknown devices get no percentage rather than a guess.
PEAK_BANDWIDTH_GBPS = (
    ("GH200", 4000.0),  # before "H200", which it contains (96 GB HBM3 variant; the 144 GB one has 4900)
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),  # SXM
    ("H800", 3350.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),  # 40GB
    ("L40S", 864.0),
    ("L40", 864.0),
    ("A10G", 600.0),
    ("A10", 600.0),
    ("L4", 300.0),
    ("RTX 4090", 1008.0),
    ("RTX 3090", 936.0),
    ("V100", 900.0),
    ("T4", 320.0),
)


@dataclass(frozen=True)
class ModelShape:
    """What decode traffic depends on, read from a transformers config."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    lm_params: int  # language-model parameters read every step (decoder + LM head; not the vision tower)
    dtype_bytes: int
    state_bytes_per_row: int = 0  # linear-attention conv + recurrent states of one sequence (Qwen3.5), any length

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, for one token of one sequence."""
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def lm_weight_bytes(self) -> int:
        return self.lm_params * self.dtype_bytes


def shape_from_model(model, dtype: str) -> ModelShape:
    """The decode-relevant shape of a loaded model: the parameters a decode step streams — everything
    but the vision tower (it runs once per image, in prefill) and an untied input embedding table."""
    text = model.config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    total = sum(p.numel() for p in model.parameters())
    vision = model.model.visual if hasattr(model, "model") and hasattr(model.model, "visual") else None
    vision_params = sum(p.numel() for p in vision.parameters()) if vision is not None else 0
    # an untied input embedding table is only gathered (batch rows per step), not streamed whole
    embed = model.get_input_embeddings()
    if embed is not None and embed.weight is not model.get_output_embeddings().weight:
        vision_params += embed.weight.numel()
    # Qwen3.5's linear-attention layers keep a fixed-size state, no keys or values: they hold no KV cache
    kinds = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    linear = sum(kind == "linear_attention" for kind in kinds)
    return ModelShape(
        layers=sum(kind != "linear_attention" for kind in kinds), kv_heads=getattr(text, "num_key_value_heads", heads),
        head_dim=head_dim,
        hidden_size=text.hidden_size, vocab_size=text.vocab_size, lm_params=total - vision_params,
        dtype_bytes=DTYPE_BYTES[dtype],
        state_bytes_per_row=linear * linear_state_bytes(text, DTYPE_BYTES[dtype]) if linear else 0,
    )


def linear_state_bytes(text, dtype_bytes: int) -> int:
    """One sequence's states in one Gated DeltaNet layer, as transformers keeps them: the conv state
    (key, key and value channels × the conv kernel, model dtype) and the recurrent state (value heads ×
    key dim × value dim, float32)."""
    key_dim, value_heads = text.linear_num_key_heads * text.linear_key_head_dim, text.linear_num_value_heads
    conv_channels = 2 * key_dim + value_heads * text.linear_value_head_dim
    return (conv_channels * text.linear_conv_kernel_dim * dtype_bytes
            + value_heads * text.linear_key_head_dim * text.linear_value_head_dim * 4)


def decode_bytes_per_step(shape: ModelShape, batch: int, context_tokens: float) -> float:
    """Bytes one decode step reads: the LM weights once, plus each sequence's KV cache so far."""
    return shape.lm_weight_bytes + batch * context_tokens * shape.kv_bytes_per_token


def peak_bandwidth_gbps(device_name: str) -> float | None:
    for fragment, gbps in PEAK_BANDWIDTH_GBPS:
        if fragment.lower() in device_name.lower():
            return gbps
    return None


def bandwidth_report(shape: ModelShape, batch: int, context_tokens: float, step_s: float,
                     device_name: str | None) -> dict:
    """Achieved decode bandwidth (GB/s, 1e9 bytes) and its share of the device's peak."""
    if step_s <= 0:
        return {"decode_gb_per_s": None, "peak_gb_per_s": None, "bandwidth_pct_of_peak": None}
    achieved = decode_bytes_per_step(shape, batch, context_tokens) / step_s / 1e9
    peak = peak_bandwidth_gbps(device_name) if device_name else None
    return {
        "decode_gb_per_s": round(achieved, 3),  # small models move little: keep the digits
        "peak_gb_per_s": peak,
        "bandwidth_pct_of_peak": round(100 * achieved / peak, 1) if peak else None,
    }


def run_bandwidth(loaded, mean_batch: float, mean_context: float, step_ms: float | None) -> dict:
    """:func:`bandwidth_report` for a loaded model on its device (the peak only for CUDA devices)."""
    if not step_ms:
        return bandwidth_report(shape_from_model(loaded.model, loaded.runtime.dtype), 1, 0, 0, None)
    name = None
    if loaded.runtime.device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(loaded.runtime.device))
    return bandwidth_report(shape_from_model(loaded.model, loaded.runtime.dtype), mean_batch, mean_context,
                            step_ms / 1000, name)
