"""Stage 3's cross-checks against the engine's own view: client and engine (/metrics) latency
agree, and the front-end overhead (client TTFT from the send minus the engine's TTFT)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from day0.client.prom import ServerFigure
from day0.core.record import Check, measured
from day0.stages.latency.measurement import LatencyRun
from day0.stages.latency.metrics import LatencyMetrics, rounded

AGREEMENT_SIGMAS = 3.0  # standard errors of the client mean added to the relative tolerance


def agreement_allowance(rel: float, mean_ms: float, std_ms: float, count: int) -> float:
    """How far two views of the same span may sit apart in this run: a relative part for what the
    views legitimately time differently, plus the run's own noise (3 standard errors of the mean),
    so a busy machine widens the allowance instead of failing the check. No fixed milliseconds."""
    se = std_ms / math.sqrt(count) if count > 0 and math.isfinite(std_ms) else 0.0
    return rel * abs(mean_ms) + AGREEMENT_SIGMAS * se


@dataclass
class Agreement:
    """One metric seen from both sides. ``one_sided``: only the engine reporting *more* than the
    client is a measurement error (the engine's TTFT span lies inside the client's)."""

    metric: str
    client_mean_ms: float
    server_mean_ms: float
    allowed_ms: float
    client_count: int
    server_count: float
    server_source: str
    one_sided: bool = False

    @property
    def diff_ms(self) -> float:
        """The disagreement that counts: engine above client (one-sided), else the absolute gap."""
        d = self.server_mean_ms - self.client_mean_ms
        return max(0.0, d) if self.one_sided else abs(d)

    @property
    def ok(self) -> bool:
        return self.diff_ms <= self.allowed_ms


# client figure each server histogram is compared with (TTFT from the actual send: the server
# cannot see time a request spent waiting in the client)
_AGREEMENT_PAIRS = {"ttft": "ttft_from_send", "itl": "itl", "tpot": "tpot"}


def delivery_slack_ms(metrics: LatencyMetrics, server: dict[str, ServerFigure]) -> float:
    """How far this run's per-token means may legitimately sit apart, from what it measured.

    A front end short of CPU holds back a request's first tokens and then delivers them in a
    burst, so the client sees a shorter decode span than the engine by up to the delay the front
    end added (the front-end overhead: client TTFT from the send minus the engine's TTFT). Spread
    over a request's tokens, that bounds the gap of the ITL and TPOT means. Measured on a 2-core
    box with two busy processes beside it: 196 ms of front-end delay, client TPOT 1.4 ms against
    the engine's 4.5 ms; on a quiet run the same slack is a tenth of a millisecond."""
    fig, st = server.get("ttft"), metrics.stats["ttft_from_send"]
    if fig is None or fig.count <= 0 or st.count == 0 or not metrics.completed:
        return 0.0
    tokens = metrics.output_tokens / metrics.completed
    return max(0.0, st.mean - fig.mean_ms) / max(1.0, tokens - 1.0)


def agreements(metrics: LatencyMetrics, server: dict[str, ServerFigure], rel: float) -> list[Agreement]:
    """Client vs engine means. The TTFT gap is front-end overhead (HTTP, tokenization, the API
    server's event loop; :func:`frontend_overhead_check`), so TTFT disagrees only when the engine
    reports more than the client saw; ITL and TPOT time the same tokens and must match within the
    run's noise and the delivery slack the front end's own delay explains (:func:`delivery_slack_ms`)."""
    out = []
    slack = delivery_slack_ms(metrics, server)
    for smetric, cmetric in _AGREEMENT_PAIRS.items():
        fig = server.get(smetric)
        st = metrics.stats[cmetric]
        if fig is None or fig.count <= 0 or st.count == 0:
            continue
        allowed = agreement_allowance(rel, st.mean, st.std, st.count) + (0.0 if smetric == "ttft" else slack)
        out.append(Agreement(smetric, st.mean, _server_mean(smetric, fig, metrics), allowed, st.count, fig.count,
                             fig.source, one_sided=smetric == "ttft"))
    return out


def _server_mean(smetric: str, fig: ServerFigure, metrics: LatencyMetrics) -> float:
    """The engine's mean over the requests the client's figure counts. vLLM's TPOT histogram
    observes a one-token request as 0 (no decode span, vLLM's stats.py) where the client's TPOT
    leaves it out (docs/metrics.md): with half the requests one token long the engine's mean read
    half the client's and the two disagreed. Those zeros add nothing to the sum, so the mean over
    the rest is the sum over the count without them."""
    singles = metrics.completed - metrics.stats["tpot"].count if smetric == "tpot" else 0
    if singles <= 0 or fig.count <= singles:
        return fig.mean_ms
    return fig.mean_ms * fig.count / (fig.count - singles)


def server_agreement_check(run: LatencyRun) -> Check:
    """Client vs engine means per metric (:func:`agreements`), worst against its allowance; a skip
    without ``/metrics``."""
    title = "Client and engine (/metrics) latency agree"
    if not run.settings.server_metrics:
        return Check(id="latency.server_agreement", title=title, status="skip",
                     message="server_metrics = false", source="http+metrics")
    if run.server_error or not run.server:
        return Check(id="latency.server_agreement", title=title, status="skip",
                     message=f"no engine view: {run.server_error or 'no histograms'}", source="http+metrics")
    ags = agreements(run.metrics, run.server, run.settings.agreement_rel)
    rows = []
    for metric, fig in run.server.items():
        cm = _AGREEMENT_PAIRS.get(metric, metric)
        st = run.metrics.stats.get(cm)
        ag = next((a for a in ags if a.metric == metric), None)
        rows.append([metric, fig.source, rounded(st.mean if st else None), rounded(ag.server_mean_ms if ag else fig.mean_ms),
                     rounded(st.percentiles.get("p50") if st else None), rounded(fig.quantiles_ms.get("p50")),
                     rounded(st.percentiles.get("p99") if st else None), rounded(fig.quantiles_ms.get("p99")),
                     st.count if st else None, fig.count,
                     rounded(ag.diff_ms) if ag else None, rounded(ag.allowed_ms) if ag else None,
                     ("ok" if ag.ok else "DISAGREE") if ag else "not judged"])
    evidence = {"table": {"columns": ["metric", "server metric", "client mean", "server mean", "client p50",
                                      "server p50 (interp.)", "client p99", "server p99 (interp.)",
                                      "client n", "server n", "|diff| mean", "allowed", "verdict"], "rows": rows},
                "note": "client TTFT here is from the actual send (the engine cannot see client queueing); the "
                        "TTFT gap is front-end overhead (latency.frontend_overhead), judged only when the engine "
                        "reports more than the client; the server's TPOT mean leaves out the 1-token requests its histogram "
                        "observes as 0, as the client's does; server percentiles are interpolated within histogram buckets"}
    if not ags:
        return Check(id="latency.server_agreement", title=title, status="skip",
                     message="no comparable histogram had observations", evidence=evidence, source="http+metrics")
    worst = max(ags, key=lambda a: a.diff_ms / a.allowed_ms if a.allowed_ms else math.inf)
    bad = [a for a in ags if not a.ok]
    msg = "; ".join(f"{a.metric}: client {a.client_mean_ms:.4g} vs engine {a.server_mean_ms:.4g} ms"
                    f" ({'engine excess' if a.one_sided else '|diff|'} {a.diff_ms:.3g}"
                    f" {'>' if not a.ok else '<='} {a.allowed_ms:.3g})" for a in ags)
    if bad:
        msg = "DISAGREE " + msg
    return measured("latency.server_agreement", title, rounded(worst.diff_ms), rounded(worst.allowed_ms), unit="ms",
                    direction="lower_is_better", message=msg, evidence=evidence, source="http+metrics")


def frontend_overhead_check(run: LatencyRun) -> Check | None:
    """Client TTFT (from the send) minus the engine's TTFT, as a figure of its own: what HTTP,
    tokenization and the API server's event loop add before the engine sees the request. It grows
    on a busy host; that is a fact about the deployment, not a disagreement of the two views."""
    fig = (run.server or {}).get("ttft")
    st = run.metrics.stats["ttft_from_send"]
    if not run.settings.server_metrics or fig is None or fig.count <= 0 or st.count == 0:
        return None
    overhead = st.mean - fig.mean_ms
    return measured("latency.frontend_overhead", "Front-end overhead before the engine (mean, TTFT gap)",
                    rounded(overhead), None, unit="ms", direction="lower_is_better", performance=True,
                    message=(f"{overhead:.4g} ms per request between the client's send and the engine's arrival "
                             f"(client TTFT {st.mean:.4g} ms vs engine {fig.mean_ms:.4g} ms, means over "
                             f"{st.count} and {fig.count:g} requests)"),
                    evidence={"client_ttft_from_send_mean_ms": rounded(st.mean),
                              "engine_ttft_mean_ms": rounded(fig.mean_ms), "engine_metric": fig.source,
                              "client_n": st.count, "engine_n": fig.count},
                    source="http+metrics")
