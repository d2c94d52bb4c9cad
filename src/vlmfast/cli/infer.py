"""``vlmfast infer``: the command line of :func:`vlmfast.run.runner.infer`."""

from __future__ import annotations

import typer

from vlmfast.cli.common import (EXIT_CODES_HELP, AllowMissing, AllowPickle, Fingerprint, AnswerKey, Attn, AutoBatchSize, Base, BboxSpace, Ckpt, Command,
                     Batching, Compile, CudaGraphs, DataParallel, Decoder, Device, Dtype, Engine, ExecutorBackend, FormatPrompt,
                     GpuMemory, IgnoreEos, ImageKey, Images, Iou, Json, Manifest, MatchTraining, MaxBatchTokens,
                     MaxImagePixels, MaxNew, MaxNumSeqs, MaxPixels, Merge, MinPixels, Out, Overlap, Overwrite,
                     PipelineParallel, Prompt, PromptFile, PromptKey, RetryErrors, Reward, RewardKwargs, RewardThreshold,
                     RewardWeights, Samples, Scorer, Seed, SkipBad, System, Temperature, Template, TensorParallel, Threads,
                     TopP, TrustRemote, UsageError, batch_size_value, command, explicit_params, from_params, guarded)


@command(cls=Command, epilog=EXIT_CODES_HELP)
def infer(
    ctx: typer.Context,
    ckpt: Ckpt,
    images: Images = None,
    prompt: Prompt = None,
    prompt_file: PromptFile = None,
    manifest: Manifest = None,
    prompt_key: PromptKey = None,
    answer_key: AnswerKey = None,
    image_key: ImageKey = None,
    template: Template = "plain",
    format_prompt: FormatPrompt = None,
    system: System = None,
    max_pixels: MaxPixels = None,
    min_pixels: MinPixels = None,
    skip_bad: SkipBad = False,
    max_image_pixels: MaxImagePixels = 89_478_485,
    batch_size: AutoBatchSize = "auto",
    max_batch_tokens: MaxBatchTokens = None,
    max_new_tokens: MaxNew = 1024,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    seed: Seed = None,
    ignore_eos: IgnoreEos = False,
    n: Samples = 1,
    match_training: MatchTraining = False,
    decoder: Decoder = "vlmfast",
    batching: Batching = "continuous",
    cuda_graphs: CudaGraphs = None,
    compile_: Compile = None,
    overlap: Overlap = None,
    threads: Threads = None,
    engine: Engine = "hf",
    tensor_parallel_size: TensorParallel = 1,
    data_parallel_size: DataParallel = 1,
    pipeline_parallel_size: PipelineParallel = 1,
    distributed_executor_backend: ExecutorBackend = None,
    gpu_memory_utilization: GpuMemory = 0.9,
    max_num_seqs: MaxNumSeqs = None,
    device: Device = None,
    dtype: Dtype = None,
    attn: Attn = None,
    trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False,
    allow_missing: AllowMissing = None,
    fingerprint: Fingerprint = "sampled",
    base: Base = None,
    merge: Merge = False,
    scorer: Scorer = "auto",
    iou: Iou = 0.5,
    bbox_space: BboxSpace = None,
    reward: Reward = None,
    reward_weights: RewardWeights = None,
    reward_kwargs: RewardKwargs = None,
    reward_threshold: RewardThreshold = 1.0,
    out: Out = None,
    overwrite: Overwrite = False,
    retry_errors: RetryErrors = False,
    json_out: Json = False,
):
    """Generate for images + prompts with the KV cache forced on; JSONL results and a timing report."""
    params = dict(locals())

    def run():
        from vlmfast.report.parity import render_parity
        from vlmfast.run.options import InferOptions
        from vlmfast.run.parallel import is_main_process
        from vlmfast.report.terminal import ProgressBar, print_json, render_infer
        from vlmfast.run.runner import infer as run_infer

        if json_out and out is None:
            raise UsageError("--json prints the report on stdout, so results need a file", hint="add --out results.jsonl")
        options = from_params(InferOptions, params, batch_size=batch_size_value(batch_size), rows_to_stdout=out is None,
                              explicit=explicit_params(ctx))
        bar = ProgressBar(enabled=None if is_main_process() else False)
        try:
            report = run_infer(options, progress=bar)
        finally:
            bar.stop()
        if not is_main_process():
            return
        render_infer(report)
        render_parity(report.parity)
        if json_out:
            print_json(report.as_dict())

    guarded(run)
