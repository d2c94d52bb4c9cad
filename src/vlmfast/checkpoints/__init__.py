"""A checkpoint on disk: model families, locating, reading configs, loading, LoRA, weight swaps, doctor
and fix, the vLLM overlay, training-run directories and the tiny offline builders. Imports only the root
leaves."""
