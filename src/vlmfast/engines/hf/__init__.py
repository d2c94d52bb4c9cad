"""vlmfast's own engine on transformers: prefill through the model, its own decode loop (static shapes,
CUDA graphs, compile policy), scheduling, memory capacity, and the as-saved reference engine."""

DECODERS = ("vlmfast", "hf")  # the decode loop: vlmfast's own, or plain model.generate (the reference)
BATCHING = ("continuous", "static")  # a row that ends takes the next request, or whole batches run to their end


def check_cuda_graphs(cuda_graphs, on_cuda: bool) -> None:
    """A UsageError for ``--cuda-graphs`` off CUDA: said by the engine, and by a run that loads nothing."""
    if cuda_graphs and not on_cuda:
        from vlmfast.errors import UsageError

        raise UsageError("--cuda-graphs needs a CUDA device", hint="drop --cuda-graphs on a CPU")


def check_decoder(decoder: str, compile, cuda_graphs) -> None:
    """A UsageError for ``--decoder hf`` (plain generate) with the own loop's ``--compile`` or ``--cuda-graphs``:
    said by the engine, and by the options, so that a run that loads nothing refuses it too."""
    if decoder == "hf" and (compile or cuda_graphs):
        from vlmfast.errors import UsageError

        raise UsageError("--compile and --cuda-graphs apply to vlmfast's decoder; --decoder hf is plain generate",
                         hint="drop --decoder hf, or drop --compile / --cuda-graphs")
