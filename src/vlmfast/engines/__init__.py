"""Generation: the contract every engine meets (what the runner drives) and what both engines share
(facts, rows, prompt preparation, batching, bandwidth). May import checkpoints, inputs, evaluation and
the root leaves; ``engines/hf`` and ``engines/vllm`` never import each other."""
