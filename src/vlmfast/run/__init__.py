"""The library's commands as calls: options checked once, the runner, results files, summaries, sweeps,
benchmarks and rescoring. May import engines, checkpoints, inputs, evaluation, report and the root leaves."""
