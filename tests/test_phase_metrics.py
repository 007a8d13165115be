"""The phase histograms on /admin/metrics: where an admitted request spent its time, receiving
its body, before the upstream send (gateway: auth, policy, admission and its waits) and after it
(upstream)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import httpx
from conftest import EmulatedProviders, Gateway

SLOW_MS = 150
CALLS = 4
_SERIES = re.compile(r'^meshfast_request_phase_seconds_(bucket|sum|count)\{phase="(\w+)"(?:,le="([^"]+)")?\} (\S+)$')


@dataclass
class Phase:
    buckets: list[tuple[float, int]] = field(default_factory=list)  # cumulative: (le, count)
    sum: float = 0.0
    count: float = 0.0

    def count_le(self, bound: float) -> int:
        return next(n for le, n in self.buckets if le >= bound)


def _phases(gateway: Gateway) -> dict[str, Phase]:
    text = gateway.admin("GET", "/admin/metrics").text
    out: dict[str, Phase] = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if not m:
            continue
        kind, name, le, value = m.groups()
        phase = out.setdefault(name, Phase())
        if kind == "bucket":
            phase.buckets.append((float("inf") if le == "+Inf" else float(le), int(value)))
        else:
            setattr(phase, kind, float(value))
    return out


def test_phases_split_slot_waits_from_the_upstream_call(gateway: Gateway, testserve: EmulatedProviders) -> None:
    user = gateway.create_user()
    provider = gateway.create_provider("ts-phases", family="anthropic", base_url=f"{testserve.base_url}/anthropic",
                                       api_key="testserve-key", max_concurrent_upstream=1, max_retries=0)
    model = gateway.create_model(provider["id"], "phases-slow", resolved_model="dummy-slow")
    gateway.grant(user["id"], model["id"])
    before = _phases(gateway)

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
            return await asyncio.gather(*(
                client.post("/v1/proxy", params={"model": "phases-slow"}, json={"query": "hi"},
                            headers={"authorization": f"Bearer {user['key']}"})
                for _ in range(CALLS)))

    slow_before = testserve.client.get("/_debug/config").json()["slow_delay_ms"]
    testserve.client.post("/_debug/config", json={"slow_delay_ms": SLOW_MS}).raise_for_status()
    try:
        responses = asyncio.run(fire())
        # A denial is not admitted: it leaves both histograms alone.
        denied = gateway.client.post("/v1/proxy", params={"model": "phases-slow"}, json={"query": "hi"},
                                     headers={"authorization": "Bearer mesh_live_not_a_key"})
    finally:
        testserve.client.post("/_debug/config", json={"slow_delay_ms": slow_before}).raise_for_status()
    assert [r.status_code for r in responses] == [200] * CALLS
    assert denied.status_code == 401
    after = _phases(gateway)

    for name in ("receive", "gateway", "upstream"):
        counts = [n for _, n in after[name].buckets]
        assert counts == sorted(counts), "cumulative buckets never decrease"
        assert after[name].buckets[-1][0] == float("inf") and counts[-1] == after[name].count
        assert after[name].count - before[name].count == CALLS
    # Every upstream call took at least the emulated delay: none below it.
    assert after["upstream"].count_le(0.1) == before["upstream"].count_le(0.1)
    assert after["upstream"].sum - before["upstream"].sum >= CALLS * SLOW_MS / 1000
    # One slot: the calls queued behind each other in admission, which is the gateway phase.
    queued_s = sum(range(CALLS)) * SLOW_MS / 1000
    assert after["gateway"].sum - before["gateway"].sum >= 0.8 * queued_s
    assert after["gateway"].count_le(0.1) - before["gateway"].count_le(0.1) >= 1, "the first call did not wait"
