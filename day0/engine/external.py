"""``external`` mode: a deployment someone else runs; only its HTTP API is visible, and it is
never stopped by day0."""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from typing import Any

from day0.config.profile import Profile
from day0.engine.endpoint import Endpoint
from day0.engine.handle import Completion, EngineError, EngineInfo, Log


class ExternalEngine:
    view = "http"

    def __init__(self, profile: Profile, log: Log) -> None:
        self.profile = profile
        self.log = log
        self.info: EngineInfo | None = None
        self.endpoint: Endpoint | None = None  # built once start() knows the served name

    @property
    def base_url(self) -> str:
        return str(self.profile.engine.url).rstrip("/")

    def start(self) -> EngineInfo:
        t0 = time.perf_counter()
        deadline = t0 + self.profile.engine.startup_timeout_s
        probe = Endpoint.for_profile(self.profile, self.base_url, self.profile.model.served_model_name or "")
        last_err = ""
        while time.perf_counter() < deadline:
            try:
                models = probe.json("/v1/models", timeout=5)
                break
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
                last_err = str(getattr(exc, "reason", exc)) or type(exc).__name__
                time.sleep(1)
        else:
            raise EngineError(f"external engine {self.base_url} not reachable within "
                              f"engine.startup_timeout_s = {self.profile.engine.startup_timeout_s:g} s: {last_err}")
        names = self._served_names(models)
        want = self.profile.model.served_model_name
        if want and want not in names:
            raise EngineError(f"external engine {self.base_url} serves {names}, not model.served_model_name = {want!r}")
        self.info = EngineInfo(mode="external", view="http", model=want or (names[0] if names else "?"),
                               served_model_name=want or (names[0] if names else "?"), base_url=self.base_url,
                               startup_s=time.perf_counter() - t0)
        self.endpoint = Endpoint.for_profile(self.profile, self.base_url, self.info.served_model_name)
        return self.info

    def _served_names(self, models: Any) -> list[str]:
        """The model ids of a ``/v1/models`` answer; any other shape is not an OpenAI-compatible server."""
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            got = repr(models)
            raise EngineError(f"external engine {self.base_url}: /v1/models is not OpenAI's model list "
                              f"({{\"data\": [{{\"id\": ...}}]}}): {got[:80]}{'...' if len(got) > 80 else ''}")
        return [m["id"] for m in data]

    def alive(self) -> str | None:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=5):
                return None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            return f"external engine {self.base_url} not healthy: {getattr(exc, 'reason', exc) or type(exc).__name__}"

    def stop(self) -> None:  # not ours to stop
        return None

    def greedy(self, prompts: list[str], max_tokens: int) -> list[Completion]:
        assert self.info is not None and self.endpoint is not None
        endpoint = self.endpoint
        return [endpoint.greedy(p, max_tokens) for p in prompts]
