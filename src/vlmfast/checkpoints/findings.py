"""What :mod:`vlmfast.checkpoints.doctor` reports: :class:`Finding` (a stable ``code``, a severity, where,
what and the exact fix) and the codes it can take. A leaf: the modules that make findings import it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

SEVERITIES = ("error", "warning", "info")
CODES = (  # every finding code diagnose can return; stable: scripts and docs depend on them
    "resolved", "cache-off", "eos-missing-im-end", "eos-differs-from-base", "eos-short-of-family", "processor-missing",
    "tokenizer-missing", "chat-template-missing", "unknown-class", "fsdp-unmerged", "weights-missing",
    "pickle-weights", "weights-unreadable", "float32-weights", "remote-code", "vocab-mismatch",
    "vocab-differs-from-base", "tie-embeddings-differs-from-base", "lora-adapter", "lora-base-missing",
    "trainer-state", "swift-args", "processor-family-mismatch", "untested-family", "weights-incomplete",
    "train-eval-differs", "weights-lost", "weights-shape-mismatch", "weights-unexpected", "weights-differ-from-base",
    "saved-by-transformers-5", "weights-two-sets", "tied-head-saved", "config-family-mismatch",
    "sampling-temperature-zero", "max-length-short", "generation-value-refused", "generation-value-misread",
)

@dataclass(frozen=True)
class Finding:
    """One problem (or fact) about a checkpoint. ``code`` is stable (tests, CI and docs use it);
    ``location`` is ``"file: key"``, a file name (relative to the diagnosed dir) or a path."""

    severity: str  # "error" | "warning" | "info"
    code: str
    location: str
    message: str
    fix: str

    def as_dict(self) -> dict:
        return asdict(self)


def findings_as_dicts(findings: list[Finding]) -> list[dict]:
    """JSON-ready findings, in order."""
    return [f.as_dict() for f in findings]


def strict_exit_code(findings: list[Finding]) -> int:
    """1 if any finding is an error (``doctor --strict``), else 0."""
    return 1 if any(f.severity == "error" for f in findings) else 0
