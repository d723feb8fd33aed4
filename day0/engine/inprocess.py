"""``inprocess`` mode: ``vllm.LLM`` in this process with V1 multiprocessing off, so the scheduler
and its KV-cache manager are plain Python objects a stage can sample."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from typing import Any, Iterator

from day0.config.profile import Profile
from day0.engine.handle import Completion, EngineError, EngineInfo, Log, served_name
from day0.engine.loaded import expert_placement
from day0.engine.rootcause import exception_root_cause
from day0.model.locate import local_model_dir, resolve_model


def engine_kwargs(args: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the args vLLM's ``EngineArgs`` takes, the names of the rest). The rest belong to the OpenAI
    API server (``tool_call_parser``, ``enable_auto_tool_choice``, ``chat_template``, ``api_key``):
    the in-process view serves no API, and ``LLM`` refuses an argument it does not know."""
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    return {k: v for k, v in args.items() if k in known}, sorted(k for k in args if k not in known)


class InprocessEngine:
    """``vllm.LLM`` in this process; the scheduler is reachable for exact KV accounting."""

    view = "scheduler"

    def __init__(self, profile: Profile, log: Log) -> None:
        self.profile = profile
        self.log = log
        self.llm: Any = None
        self.info: EngineInfo | None = None
        self._saved_env: dict[str, str | None] = {}

    def start(self) -> EngineInfo:
        eng = self.profile.engine
        model = resolve_model(self.profile, self.log)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **eng.env}
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self.log("starting in-process vLLM engine (V1 multiprocessing off)")
        t0 = time.perf_counter()
        try:
            with _deadline(eng.startup_timeout_s):
                from vllm import LLM

                kwargs, frontend = engine_kwargs(eng.args)
                if frontend:
                    self.log(f"in-process engine: the API server's own args left out: {', '.join(frontend)}")
                self.llm = LLM(model=model, served_model_name=served_name(self.profile),
                               disable_log_stats=False, **kwargs)
        except _Timeout:
            self.stop()
            raise EngineError(f"in-process engine not ready within engine.startup_timeout_s = "
                              f"{eng.startup_timeout_s:g} s") from None
        except Exception as exc:  # vLLM raises many kinds; the chain holds the root cause
            self.stop()
            raise EngineError(exception_root_cause(exc)) from exc
        self.info = EngineInfo(mode="inprocess", view="scheduler", model=model,
                               served_model_name=served_name(self.profile),
                               startup_s=time.perf_counter() - t0, args=dict(eng.args), env=dict(eng.env),
                               experts=expert_placement(local_model_dir(self.profile), dict(eng.args), []))
        self.log(f"in-process engine ready after {self.info.startup_s:.1f} s")
        return self.info

    @property
    def scheduler(self) -> Any:
        """The V1 scheduler (``kv_cache_manager``, running requests) of the in-process core."""
        return self.llm.llm_engine.engine_core.engine_core.scheduler

    def alive(self) -> str | None:
        return None if self.llm is not None else "in-process engine not running"

    def stop(self) -> None:
        if self.llm is not None:
            with contextlib.suppress(Exception):
                self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            import gc

            gc.collect()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def greedy(self, prompts: list[str], max_tokens: int, logprobs: int = 0) -> list[Completion]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                logprobs=logprobs or None)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [_completion(o, logprobs) for o in outs]


def _completion(out: Any, logprobs: int) -> Completion:
    first = out.outputs[0]
    top = None
    if logprobs:
        top = [{int(t): float(lp.logprob) for t, lp in (step or {}).items()} for step in (first.logprobs or [])]
    return Completion(text=first.text, token_ids=list(first.token_ids), completion_tokens=len(first.token_ids),
                      top_logprobs=top, prompt_token_ids=list(out.prompt_token_ids or []) if logprobs else None)


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Bound a blocking call on the main thread (elsewhere it runs unbounded, and says so)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
