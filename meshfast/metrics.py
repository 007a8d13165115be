"""Instance-wide Prometheus counters, kept in the shared-memory segment.

Every worker adds to the same counters (one atomic add each, no lock, no database), so a scrape
of any worker sees the whole instance, and a worker's death loses nothing it counted. Series are
a fixed set (routes x outcomes, deny reasons, upstream attempt results): the segment is a hash
table, so what is exported must be known up front; anything else is counted under ``other``.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Any

from meshfast import _core
from meshfast._core import GLOBAL_INFLIGHT, ShmError, counter_key
from meshfast.looplag import LAG_BUCKETS_US
from meshfast.telemetry import metrics as telemetry_metrics

log = logging.getLogger(__name__)

ROUTES = ("proxy", "embeddings", "generate", "openai_chat", "openai_responses", "anthropic", "gemini", "ollama",
          "openai_embeddings")
OUTCOMES = ("success", "upstream_error", "denied")
# Every code a denied row can carry (the core's table of data-plane outcomes), then ``other``.
DENY_REASONS = (*(code for code, spec in _core.OUTCOMES.items() if spec.denial), "other")
# An upstream attempt ends in a status class or a transport failure.
ATTEMPT_RESULTS = ("2xx", "4xx", "429", "5xx", "transport")
# An admitted request's time in three phases on one clock: ``receive``, from the handler's start to
# the whole body in hand (the HTTP server passing it over); ``gateway``, authentication, policy,
# rendering and admission (including any wait for the provider's limiter or concurrency slots) up to
# the upstream send; ``upstream``, from there to the last byte to the caller (the upstream call,
# retries and failover, stream translation and the writes).
PHASES = ("receive", "gateway", "upstream")
# Upper bounds in microseconds (log-linear: fine where the gateway's own cost lies, coarse in the
# waits); one more bucket, +Inf, holds the rest.
PHASE_BUCKETS_US = (
    10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 125, 150, 175, 200, 250, 300, 350, 400, 500, 600, 700, 800,
    900, 1_000, 1_250, 1_500, 1_750, 2_000, 2_500, 3_000, 4_000, 5_000, 7_500, 10_000, 15_000, 20_000,
    30_000, 50_000, 75_000, 100_000, 250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000,
    16_000_000, 32_000_000,
)


def _key(series: str) -> bytes:
    # NOTE: GLOBAL_INFLIGHT is the core's process-wide counter kind (no period); the name keeps
    # these keys apart from the in-flight weight's and from telemetry's.
    return counter_key(GLOBAL_INFLIGHT, "meshfast.metrics", series, 0)


_REQUESTS = {(r, o): _key(f"requests:{r}:{o}") for r in ROUTES for o in OUTCOMES}
_DENIALS = {reason: _key(f"denials:{reason}") for reason in DENY_REASONS}
_ATTEMPTS = {result: _key(f"attempts:{result}") for result in ATTEMPT_RESULTS}
_RETRIES = _key("retries")
# Data protection: detections by detector (the built-in ones by name, operators' patterns together
# as "custom": bounded cardinality) and by the action the call took.
DLP_DETECTORS = ("card", "iban", "email", "phone", "ssn", "ip", "secret", "person", "address", "custom")
DLP_ACTIONS = ("block", "pseudonymize", "redact")
_DLP = {(d, a): _key(f"dlp:{d}:{a}") for d in DLP_DETECTORS for a in DLP_ACTIONS}
_UNCLASSIFIED = _key("unclassified_fields")
# Per phase: one counter per bucket (not cumulative; the exposition sums them) and the sum in ns.
_PHASE_BUCKETS = {ph: tuple(_key(f"phase:{ph}:{i}") for i in range(len(PHASE_BUCKETS_US) + 1)) for ph in PHASES}
_PHASE_SUM_NS = {ph: _key(f"phase_sum_ns:{ph}") for ph in PHASES}
_PHASE_BOUNDS_NS = tuple(us * 1000 for us in PHASE_BUCKETS_US)
# Every worker's loop-lag probe (meshfast.looplag) adds its ticks here: one histogram per instance.
_LAG_BUCKETS = tuple(_key(f"loop_lag:{i}") for i in range(len(LAG_BUCKETS_US) + 1))
_LAG_SUM_NS = _key("loop_lag_sum_ns")

# Per model (labelled with its name and provider's, never with a person: bounded cardinality) and
# per provider. Keys are made on first sight of an id and kept.
MODEL_OUTCOMES = OUTCOMES
TOKEN_TYPES = ("input", "output", "cache_read", "cache_write")
UPSTREAM_STATUSES = ("2xx", "4xx", "429", "5xx")
# Time to the first byte from the upstream, upper bounds in seconds (+Inf beyond).
TTFB_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TTFB_BOUNDS_MS = tuple(b * 1000 for b in TTFB_BUCKETS_S)


class _ModelKeys:
    __slots__ = ("calls", "cost", "tokens")

    def __init__(self, model_id: str) -> None:
        self.calls = {o: _key(f"model:{model_id}:calls:{o}") for o in MODEL_OUTCOMES}
        self.tokens = tuple(_key(f"model:{model_id}:tokens:{t}") for t in TOKEN_TYPES)
        self.cost = _key(f"model:{model_id}:cost_nano")


class _ProviderKeys:
    __slots__ = ("status", "ttfb", "ttfb_sum_ms")

    def __init__(self, provider_id: str) -> None:
        self.status = {c: _key(f"provider:{provider_id}:status:{c}") for c in UPSTREAM_STATUSES}
        self.ttfb = tuple(_key(f"provider:{provider_id}:ttfb:{i}") for i in range(len(TTFB_BUCKETS_S) + 1))
        self.ttfb_sum_ms = _key(f"provider:{provider_id}:ttfb_sum_ms")


def _label(value: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _status_class(status: int) -> str | None:
    if status == 429:
        return "429"
    if 200 <= status < 300 or 400 <= status < 600:
        return f"{status // 100}xx"
    return None


# Queued adds past which an event flushes them itself (a path that never ends in a request's row).
MAX_QUEUED = 256


class Metrics:
    """The counters of one instance; cheap enough for the request path: an event queues its
    adds (a dict lookup and a list append), and :meth:`flush` makes them in one call into the
    core (a request's end does, after its row)."""

    def __init__(self, segment: Any) -> None:
        self._segment = segment
        self._models: dict[str, _ModelKeys] = {}
        self._providers: dict[str, _ProviderKeys] = {}
        self._pending: list[tuple[bytes, int]] = []
        self._full_logged = False

    def flush(self) -> None:
        """Makes the queued adds. A full table loses the adds it has no slot for (logged once),
        never the request that flushed them: it may be another request's, mid-call."""
        pending = self._pending
        if pending:
            self._pending = []
            try:
                self._segment.add_many(pending)
            except (ShmError, ValueError) as exc:
                if not self._full_logged:
                    self._full_logged = True
                    log.error("metrics: counters lost (%s); raise MESHFAST_SHM_SLOTS", exc)

    def row(self, row: Any) -> None:
        """A finished request's usage by model (a few atomic adds): calls by outcome, tokens,
        cost; and the time to its first byte by the provider that served it. (The providers'
        answers by status class are counted per attempt: :meth:`attempt`.)"""
        add = self._queue
        if row.dlp and row.dlp_action in DLP_ACTIONS:
            for detector, n in row.dlp.items():
                key = _DLP.get((detector if detector in DLP_DETECTORS else "custom", row.dlp_action))
                if key is not None and n:
                    add(key, n)
        if row.model_id:
            keys = self._models.get(row.model_id)
            if keys is None:
                keys = self._models[row.model_id] = _ModelKeys(row.model_id)
            calls = keys.calls.get(row.outcome)
            if calls is not None:
                add(calls, row.count)
            for key, n in zip(keys.tokens, (row.tokens_in, row.tokens_out, row.cache_read_tokens,
                                            row.cache_write_tokens), strict=True):
                if n:
                    add(key, n)
            cost = row.input_cost_nano + row.output_cost_nano
            if cost:
                add(keys.cost, cost)
        if row.provider_id and row.ttfb_ms is not None:
            pkeys = self._providers.get(row.provider_id)
            if pkeys is None:
                pkeys = self._providers[row.provider_id] = _ProviderKeys(row.provider_id)
            add(pkeys.ttfb[bisect_left(_TTFB_BOUNDS_MS, row.ttfb_ms)], 1)
            add(pkeys.ttfb_sum_ms, row.ttfb_ms)

    def _queue(self, key: bytes, n: int) -> None:
        pending = self._pending
        pending.append((key, n))
        if len(pending) >= MAX_QUEUED:
            self.flush()

    def request(self, route: str, outcome: str, deny_reason: str | None, count: int = 1) -> None:
        key = _REQUESTS.get((route, outcome))
        if key is not None:
            self._queue(key, count)
        if deny_reason is not None:
            self._queue(_DENIALS.get(deny_reason, _DENIALS["other"]), count)

    def attempt(self, status: int | None, retried: bool, provider: str | None = None) -> None:
        """One upstream attempt: its result and, when the provider answered, its status class by provider."""
        if provider and status is not None and (cls := _status_class(status)) is not None:
            pkeys = self._providers.get(provider)
            if pkeys is None:
                pkeys = self._providers[provider] = _ProviderKeys(provider)
            self._queue(pkeys.status[cls], 1)
        if status is None:
            result = "transport"
        elif status == 429:
            result = "429"
        else:
            result = f"{min(status // 100, 5)}xx" if status >= 200 else "transport"
        self._queue(_ATTEMPTS.get(result, _ATTEMPTS["transport"]), 1)
        if retried:
            self._queue(_RETRIES, 1)

    def unclassified(self, n: int) -> None:
        self._queue(_UNCLASSIFIED, n)

    def phase(self, phase: str, ns: int) -> None:
        """One admitted request's time in ``phase`` (two atomic adds)."""
        ns = max(ns, 0)
        self._queue(_PHASE_BUCKETS[phase][bisect_left(_PHASE_BOUNDS_NS, ns)], 1)
        self._queue(_PHASE_SUM_NS[phase], ns)

    def loop_lag(self, counts: list[int], sum_ns: int) -> None:
        """A loop-lag probe's ticks since its last flush (non-cumulative bucket counts); the
        queued adds go with them, so a worker's counters are never more than a flush behind."""
        self.flush()
        add = self._segment.add
        for key, n in zip(_LAG_BUCKETS, counts, strict=True):
            if n:
                add(key, n)
        add(_LAG_SUM_NS, sum_ns)

    def loop_lags(self) -> dict[str, Any]:
        """The instance's loop-lag ticks: ``buckets`` (non-cumulative, the last one +Inf), ``count``, ``sum_ns``."""
        get = self._segment.get
        buckets = [get(k) for k in _LAG_BUCKETS]
        return {"buckets": buckets, "count": sum(buckets), "sum_ns": get(_LAG_SUM_NS)}

    def phases(self) -> dict[str, dict[str, Any]]:
        """Per phase: ``buckets`` (non-cumulative counts, the last one +Inf), ``count``, ``sum_ns``."""
        get = self._segment.get
        out = {}
        for ph in PHASES:
            buckets = [get(k) for k in _PHASE_BUCKETS[ph]]
            out[ph] = {"buckets": buckets, "count": sum(buckets), "sum_ns": get(_PHASE_SUM_NS[ph])}
        return out

    def snapshot(self) -> dict[str, Any]:
        get = self._segment.get
        return {
            "requests": {f"{r}:{o}": get(k) for (r, o), k in _REQUESTS.items()},
            "denials": {reason: get(k) for reason, k in _DENIALS.items()},
            "attempts": {result: get(k) for result, k in _ATTEMPTS.items()},
            "retries": get(_RETRIES),
            "unclassified_fields": get(_UNCLASSIFIED),
            "phases": self.phases(),
            "loop_lag": self.loop_lags(),
            "telemetry": telemetry_metrics(self._segment),
        }

    def _by_model(self, models: list[tuple[str, str, str]], providers: list[tuple[str, str]]) -> list[str]:
        """Series per model (``models``: id, name, provider name) and per provider (id, name)."""
        get = self._segment.get
        lines = ["# HELP meshfast_model_requests_total Requests by model, its provider and outcome.",
                 "# TYPE meshfast_model_requests_total counter"]
        tokens = ["# HELP meshfast_model_tokens_total Tokens by model and type (input, output, cache reads and "
                  "writes).", "# TYPE meshfast_model_tokens_total counter"]
        cost = ["# HELP meshfast_model_cost_usd_total What the calls to a model cost (USD).",
                "# TYPE meshfast_model_cost_usd_total counter"]
        for model_id, name, provider in models:
            keys = self._models.get(model_id) or self._models.setdefault(model_id, _ModelKeys(model_id))
            labels = f'model="{_label(name)}",provider="{_label(provider)}"'
            lines += [f'meshfast_model_requests_total{{{labels},outcome="{o}"}} {get(k)}'
                      for o, k in keys.calls.items()]
            tokens += [f'meshfast_model_tokens_total{{{labels},type="{t}"}} {get(k)}'
                       for t, k in zip(TOKEN_TYPES, keys.tokens, strict=True)]
            cost.append(f"meshfast_model_cost_usd_total{{{labels}}} {get(keys.cost) / 1e9:.9f}")
        status = ["# HELP meshfast_provider_upstream_responses_total A provider's answers to upstream attempts "
                  "(retries included), by status class.", "# TYPE meshfast_provider_upstream_responses_total counter"]
        ttfb = ["# HELP meshfast_provider_ttfb_seconds Time from the request's start to the provider's first byte.",
                "# TYPE meshfast_provider_ttfb_seconds histogram"]
        for provider_id, name in providers:
            pkeys = self._providers.get(provider_id) or self._providers.setdefault(provider_id,
                                                                                  _ProviderKeys(provider_id))
            label = f'provider="{_label(name)}"'
            status += [f'meshfast_provider_upstream_responses_total{{{label},status="{c}"}} {get(k)}'
                       for c, k in pkeys.status.items()]
            cumulative = 0
            for bound, key in zip((*TTFB_BUCKETS_S, None), pkeys.ttfb, strict=True):
                cumulative += get(key)
                le = "+Inf" if bound is None else f"{bound:g}"
                ttfb.append(f'meshfast_provider_ttfb_seconds_bucket{{{label},le="{le}"}} {cumulative}')
            ttfb += [f"meshfast_provider_ttfb_seconds_sum{{{label}}} {get(pkeys.ttfb_sum_ms) / 1000:.3f}",
                     f"meshfast_provider_ttfb_seconds_count{{{label}}} {cumulative}"]
        return lines + tokens + cost + status + ttfb

    def prometheus(self, extra: dict[str, float] | None = None, models: list[tuple[str, str, str]] | None = None,
                   providers: list[tuple[str, str]] | None = None) -> bytes:
        """The Prometheus text exposition (version 0.0.4) of every series; per model and provider
        for those given (the snapshot's)."""
        get = self._segment.get
        lines = [
            "# HELP meshfast_requests_total Data-plane POST requests by route and outcome.",
            "# TYPE meshfast_requests_total counter",
        ]
        lines += [f'meshfast_requests_total{{route="{r}",outcome="{o}"}} {get(k)}' for (r, o), k in _REQUESTS.items()]
        lines += ["# HELP meshfast_denials_total Denied requests by reason.", "# TYPE meshfast_denials_total counter"]
        lines += [f'meshfast_denials_total{{reason="{reason}"}} {get(k)}' for reason, k in _DENIALS.items()]
        lines += ["# HELP meshfast_dlp_detections_total Sensitive values data protection found, by detector and the "
                  "action the call took.", "# TYPE meshfast_dlp_detections_total counter"]
        lines += [f'meshfast_dlp_detections_total{{detector="{d}",action="{a}"}} {get(k)}'
                  for (d, a), k in _DLP.items()]
        lines += ["# HELP meshfast_upstream_attempts_total Upstream attempts by result.",
                  "# TYPE meshfast_upstream_attempts_total counter"]
        lines += [f'meshfast_upstream_attempts_total{{result="{res}"}} {get(k)}' for res, k in _ATTEMPTS.items()]
        lines += ["# HELP meshfast_upstream_retries_total Upstream attempts that were retries.",
                  "# TYPE meshfast_upstream_retries_total counter", f"meshfast_upstream_retries_total {get(_RETRIES)}",
                  "# HELP meshfast_unclassified_request_fields_total Request fields an entry codec could not classify.",
                  "# TYPE meshfast_unclassified_request_fields_total counter",
                  f"meshfast_unclassified_request_fields_total {get(_UNCLASSIFIED)}"]
        lines += ["# HELP meshfast_request_phase_seconds An admitted request's time by phase: receive (the body), "
                  "gateway (auth, policy, render, admission and its waits) and upstream (the call, stream "
                  "translation and the writes to the caller).",
                  "# TYPE meshfast_request_phase_seconds histogram"]
        for ph, h in self.phases().items():
            cumulative = 0
            for bound, n in zip((*PHASE_BUCKETS_US, None), h["buckets"], strict=True):
                cumulative += n
                le = "+Inf" if bound is None else f"{bound / 1e6:g}"
                lines.append(f'meshfast_request_phase_seconds_bucket{{phase="{ph}",le="{le}"}} {cumulative}')
            lines.append(f'meshfast_request_phase_seconds_sum{{phase="{ph}"}} {h["sum_ns"] / 1e9:.9f}')
            lines.append(f'meshfast_request_phase_seconds_count{{phase="{ph}"}} {cumulative}')
        lag = self.loop_lags()
        lines += ["# HELP meshfast_loop_lag_seconds How late the workers' event loops ran the loop-lag probe's "
                  "timer (sampled every MESHFAST_LOOP_LAG_PROBE_MS): time in which no request of that worker "
                  "made progress.",
                  "# TYPE meshfast_loop_lag_seconds histogram"]
        cumulative = 0
        for bound, n in zip((*LAG_BUCKETS_US, None), lag["buckets"], strict=True):
            cumulative += n
            le = "+Inf" if bound is None else f"{bound / 1e6:g}"
            lines.append(f'meshfast_loop_lag_seconds_bucket{{le="{le}"}} {cumulative}')
        lines += [f"meshfast_loop_lag_seconds_sum {lag['sum_ns'] / 1e9:.9f}",
                  f"meshfast_loop_lag_seconds_count {cumulative}"]
        for name, value in telemetry_metrics(self._segment).items():
            series = f"meshfast_telemetry_rows_{name}_total"
            lines += [f"# TYPE {series} counter", f"{series} {value}"]
        for name, gauge in (extra or {}).items():
            lines += [f"# TYPE meshfast_{name} gauge", f"meshfast_{name} {gauge:g}"]
        lines += self._by_model(models or [], providers or [])
        return ("\n".join(lines) + "\n").encode()
