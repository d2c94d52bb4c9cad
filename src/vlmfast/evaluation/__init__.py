"""Judging answers: scorers, the trainers' reward functions, n-answer metrics and statistics. Imports only
the root leaves, never torch."""
