"""One prepared run of day0's GPU code paths on a borrowed CUDA machine that has no vLLM.

Sessions with a GPU get it for minutes, once, with no network and a small bag of files coming
back; so the run is prepared here and tested on CPU, then started there in one shot
(``bash scripts/device-check.sh``, docs/device-check.md). It exercises what no CPU run can:
weight memory per rank through ``torch.cuda`` against the stage-0 plan, the collectives sweep on
NCCL with CUDA-event timing and a real ``NCCL_DEBUG=INFO`` log fed to the parsers, and the
transformers reference tokens on the GPU in float32 and bfloat16 against CPU float32. Everything
lands in one folder (a run record ``day0 report`` renders, the logs, ``summary.json``). On a
machine without CUDA the GPU parts are ``skip`` checks naming why, and the CPU parts run for real.

Modules: ``run`` (options, budget, the folder, the record, ``main``/``add_cli``), ``steps`` (the
model, the plan, memory per rank, reference tokens), ``sweep`` (the collectives step).
"""

from day0.device_check.run import add_cli, main

__all__ = ["add_cli", "main"]
