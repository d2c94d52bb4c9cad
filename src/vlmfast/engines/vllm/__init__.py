"""vLLM as an engine behind the same contract: requests in, rows out, for users who outgrow one process."""
