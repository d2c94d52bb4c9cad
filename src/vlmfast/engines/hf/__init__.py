"""vlmfast's own engine on transformers: prefill through the model, its own decode loop (static shapes,
CUDA graphs, compile policy), scheduling, memory capacity, and the as-saved reference engine."""

DECODERS = ("vlmfast", "hf")  # the decode loop: vlmfast's own, or plain model.generate (the reference)
BATCHING = ("continuous", "static")  # a row that ends takes the next request, or whole batches run to their end
