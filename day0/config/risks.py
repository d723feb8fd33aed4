"""The profile's ``[risks]`` tables: tenant isolation, quantization accuracy, cost.

:class:`RisksSection` groups the three tables as ``Profile.risks``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from day0.config.section import Section, checked_args, checked_env

# A fixed evaluation text: plain prose that any tokenizer splits into ordinary tokens. Only the
# first ``max_tokens`` tokens are scored, so the same text serves a 384-token toy vocabulary and
# a 128K one; both the deployed and the reference engine score exactly the same token ids.
EVAL_TEXT = (
    "The river rose slowly through the night, and by morning the lower fields were under water. "
    "Farmers moved their animals to the hills, while the children watched the brown current "
    "carry branches, fences and a small wooden boat past the old stone bridge. In the village, "
    "the baker kept his ovens burning so that everyone who came in from the rain could have "
    "bread and something warm to drink. Nobody remembered a flood like it, although the oldest "
    "woman in the valley said her grandmother had told stories of a winter when the whole plain "
    "became a lake and the church bell rang for three days. When the water finally went down, "
    "the soil was dark and rich, and that summer the harvest was the best in forty years."
)


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)  # a price of inf, a cost


class IsolationSettings(_Table):
    """``[risks.isolation]``: who shares the deployment and how their requests are kept apart."""

    enabled: bool = True
    # Declared: how many tenants send requests to this one deployment.
    tenants: int = Field(1, ge=1)
    # Declared: how production requests are salted. "per_tenant": the gateway sets vLLM's
    # cache_salt to a per-tenant value; "none": requests carry no salt. Measured as declared.
    salt: Literal["per_tenant", "none"] = "per_tenant"
    # Prompt length of the probes: long enough to span many KV blocks and make a cache hit visible.
    # At most 2^24, as parity's long context: past every context window, and each probe's prompt is
    # built whole in memory (~18 MiB a million tokens) before the first request.
    prompt_tokens: int = Field(1024, ge=64, le=1 << 24)
    timing_samples: int = Field(5, ge=1, le=100)  # TTFT samples per side (hit, miss)
    # Declared, not measured: what keeps tenants apart outside the engine; a person confirms
    # these at sign-off. Empty with tenants > 1 fails the check (nothing to confirm).
    network: str = ""
    storage: str = ""


class AccuracySettings(_Table):
    """``[risks.accuracy]``: the deployed model scored against a reference on a fixed text."""

    enabled: bool = True
    # "transformers": Hugging Face transformers scores the same tokens on the host CPU in float32
    # (the deployment's own checkpoint, or ``reference_model``): an independent implementation, and
    # no second server; "variant": a second server started beside the deployment with
    # ``reference_args`` (and ``reference_model``) changed; "url": a reference deployment someone
    # else runs; "none": skip.
    reference: Literal["transformers", "variant", "url", "none"] = "variant"
    # Engine-arg changes for the reference, tried in order until one starts (a CPU kernel that
    # dies with SIGILL on one box may work on the next).
    reference_args: list[dict[str, Any]] = [{"dtype": "bfloat16"}]
    reference_env: dict[str, str] = {}
    reference_model: Optional[str] = None  # other weights for the reference (a local dir; a hub id for "variant")
    reference_url: Optional[str] = None
    reference_served_name: Optional[str] = None  # model name at reference_url (default: its first)
    text: str = Field(EVAL_TEXT, min_length=1)
    max_tokens: int = Field(128, ge=8)  # tokens of ``text`` scored (prompt_logprobs is slow on CPU)
    top_k: int = Field(5, ge=1, le=20)  # vLLM's default max_logprobs is 20
    max_ppl_delta: float = Field(0.02, gt=0)  # |PPL_deployed / PPL_reference - 1|
    min_top1_agreement: float = Field(0.9, ge=0, le=1)
    max_mean_kl: float = Field(0.01, gt=0)  # nats per token, top-k lower bound
    # Downstream tasks (lm-eval, the day0[eval] extra): names of tasks in the shipped folder or in
    # ``task_paths`` (local YAML folders: no hub downloads), scored on the deployment and on the
    # transformers reference; a drop in accuracy beyond ``max_task_delta`` fails.
    tasks: list[str] = ["day0_tiny_qa"]
    task_paths: list[str] = []
    max_task_delta: float = Field(0.05, ge=0, le=1)  # accuracy points, as a fraction
    task_timeout_s: float = Field(600, gt=0)  # per side

    @field_validator("reference_env")
    @classmethod
    def _reference_env(cls, value: dict[str, str]) -> dict[str, str]:
        return checked_env(value)  # merged into a reference engine's [engine.env]: the same rules

    @field_validator("reference_args")
    @classmethod
    def _reference_args(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, args in enumerate(value):  # merged into a reference engine's [engine.args] without a second check
            checked_args(args, f"[{i}].")
        return value

    @model_validator(mode="after")
    def _args(self) -> "AccuracySettings":
        if self.reference == "variant" and not self.reference_args and not self.reference_model:
            raise ValueError("reference_args: a variant reference needs changed args or reference_model")
        if self.reference == "transformers" and self.reference_url:
            raise ValueError("reference_url: only read with reference = \"url\" (this one is \"transformers\")")
        if self.reference == "transformers" and self.reference_model is not None and not self.reference_model.strip():
            raise ValueError("reference_model: empty; leave it out to score the deployment's own checkpoint")
        return self


class CostSettings(_Table):
    """``[risks.cost]``: price assumptions and budgets; throughput comes from the run."""

    enabled: bool = True
    currency: str = "USD"
    price_per_device_hour: Optional[float] = Field(None, ge=0)
    devices: Optional[int] = Field(None, ge=1)  # default: topology nodes x devices_per_node
    # Share of the hours the deployment serves at the measured throughput (1 = always busy).
    utilization: float = Field(1.0, gt=0, le=1)
    max_per_million_output_tokens: Optional[float] = Field(None, gt=0)
    max_per_hour: Optional[float] = Field(None, gt=0)
    # Own short measurement when stage 3 did not record latency.output_throughput in this run.
    measure_requests: int = Field(8, ge=1, le=100_000)  # a short measurement; its requests are held in memory


class RisksSection(Section):
    """``[risks]``: tenant isolation, quantization accuracy, cost."""

    isolation: IsolationSettings = IsolationSettings()
    accuracy: AccuracySettings = AccuracySettings()
    cost: CostSettings = CostSettings()
