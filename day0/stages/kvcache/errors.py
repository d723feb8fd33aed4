"""The kvcache stage's errors: a measurement that could not be made, and a workload the engine refuses."""

from __future__ import annotations


class KvCacheError(RuntimeError):
    """A kvcache measurement that could not be made; the message is one actionable line."""


class WorkloadRejected(KvCacheError):
    """A workload request longer than the engine's ``max_model_len``: a configuration failure."""

    def __init__(self, context: int, max_model_len: int, detail: str = "",
                 keys: str = "kvcache.context_lengths / kvcache.target_context") -> None:
        self.context = context
        self.max_model_len = max_model_len
        self.detail = detail
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"a request needs {context} tokens of context but the engine's max_model_len is {max_model_len}: "
            f"lower {keys} or raise engine.args.max_model_len{extra}")
