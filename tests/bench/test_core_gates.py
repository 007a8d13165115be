"""pytest-benchmark gates on the in-process request path (run with --benchmark-only).

These are budgets, not functional tests: CI runs them as their own step.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import os
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from meshfast._core import Core, Segment
from meshfast.secrets import new_mesh_key
from meshfast.snapshot import Config, Grant, Key, Model, Principal, Provider, encode

# Regression bound: a gate's fastest run (min of N, robust to a busy shared machine) may be at
# most this much slower than the committed baseline's; a real 2x regression fails.
REGRESSION_BOUND = 1.5
_BASELINE_DOC = json.loads((Path(__file__).with_name("baseline.json")).read_text())
BASELINE = _BASELINE_DOC["min_s"]
# The calibration workload's fastest run on the machine that recorded the baseline.
BASELINE_CALIBRATION_S = _BASELINE_DOC["calibration_s"]
# Per gate, the reference workload's median and fastest run between that gate's rounds, recorded
# with the baseline (see _interleaved).
BASELINE_REFERENCE = _BASELINE_DOC["reference"]
BASELINE_MEDIAN = _BASELINE_DOC["median_s"]
# MESHFAST_RECORD_BASELINE=<path>: the gates record a new baseline there instead of judging.
_RECORD = os.environ.get("MESHFAST_RECORD_BASELINE")
_RECORDED: dict[str, dict[str, Any]] = {"min_s": {}, "median_s": {}, "reference": {}}
AUTHENTICATE_BUDGET_S = 2e-6
MODELS_VIEW_BUDGET_S = 20e-6
PEPPER = b"p" * 32


def _config(n_users: int, core_hash) -> tuple[Config, list[str]]:  # type: ignore[no-untyped-def]
    providers = [Provider(id=str(uuid.uuid4()), name="bench", family="openai", max_calls_per_hour=None,
                          supports_web_search=False)]
    models = [
        Model(id=str(uuid.uuid4()), name=f"bench-model-{i}", provider=0, resolved_model="gpt-bench",
              max_output_tokens=4096, price_per_second_nano=0, kind="chat", created_ms=0, blocked=False,
              status="active", supports_image_in=False, supports_document_in=False, supports_audio_in=False,
              supports_video_in=False, supports_web_search=False, output_media_type=None,
              input_price_nano_per_1k=1_000_000, output_price_nano_per_1k=2_000_000)
        for i in range(5)
    ]
    principals, keys, grants, tokens = [], [], [], []
    for i in range(n_users):
        token, _ = new_mesh_key()
        tokens.append(token)
        principals.append(Principal(id=str(uuid.uuid4()), email=f"u{i}@example.com", display_name=f"U{i}",
                                    status="active", expires_at_ms=None))
        keys.append(Key(id=str(uuid.uuid4()), principal=i, digest=core_hash(token), status="active",
                        expires_at_ms=None))
        grants += [Grant(principal=i, model=m, daily_cap_nano_usd=20_000_000_000, max_calls_per_hour=None,
                         allowed_from_min=None, allowed_to_min=None, timezone="UTC", active_days=[],
                         always_open=False) for m in range(5)]
    return Config(seq=1, kill_switch=False, principals=principals, keys=keys, providers=providers,
                  models=models, grants=grants), tokens


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Core, list[str]]:
    segment = Segment.create(str(tmp_path_factory.mktemp("seg") / "bench.seg"))
    segment.register()
    core = Core(PEPPER, segment)
    config, tokens = _config(10_000, core.hash_token)
    core.load(encode(config))
    return core, tokens


def test_authenticate_under_2us(benchmark, loaded) -> None:  # type: ignore[no-untyped-def]
    """One authenticate call (SHA-256 + index lookup) among 10 000 keys: median under 2 µs."""
    core, tokens = loaded
    header = f"Bearer {tokens[1234]}"
    assert core.authenticate(header, None, None, None, 0) is not None
    _gate(benchmark, "authenticate", core.authenticate, AUTHENTICATE_BUDGET_S, rounds=100_000, every=200,
          args=(header, None, None, None, 0))


def test_models_view_under_budget(benchmark, loaded) -> None:  # type: ignore[no-untyped-def]
    """The full GET /v1/models answer for a user with 5 models, built in the core."""
    core, tokens = loaded
    header = f"Bearer {tokens[42]}"
    status, _ = core.models_json(header, None, None, None, 1_764_000_000_000)
    assert status == 200
    _gate(benchmark, "models_view", core.models_json, MODELS_VIEW_BUDGET_S, rounds=50_000, every=100,
          args=(header, None, None, None, 1_764_000_000_000))


# Platform tokens (issue "identity"): a first sight verifies the signature and the claims; a
# token seen before is one lookup in the verdict cache.
TOKEN_FIRST_SIGHT_BUDGET_S = {"RS256": 25e-6, "ES256": 100e-6, "EdDSA": 60e-6}
TOKEN_CACHED_BUDGET_S = 5e-6
TOKEN_NOW_MS = 1_764_000_000_000


@pytest.fixture(scope="module")
def token_core(tmp_path_factory: pytest.TempPathFactory) -> tuple[Core, dict[str, str], str]:
    return make_token_core(tmp_path_factory.mktemp("seg"))


def make_token_core(directory: Path) -> tuple[Core, dict[str, str], str]:
    """The authenticate gate's 10 000 people and keys, plus an issuer with a key of each
    algorithm: a token per algorithm for one of them, and that person's issued key (also
    bench/identity_bench.py's configuration)."""
    from jwtkit import Issuer as TestIssuer
    from jwtkit import jwks, new_key

    from meshfast.snapshot import Issuer

    segment = Segment.create(str(directory / "tokens.seg"))
    segment.register()
    core = Core(PEPPER, segment)
    config, keys = _config(10_000, core.hash_token)
    issuer = TestIssuer("https://idp.example.com")
    for alg in TOKEN_FIRST_SIGHT_BUDGET_S:
        issuer.keys[alg] = new_key(alg, f"kid-{alg}")
    config.issuers = [Issuer(id=str(uuid.uuid4()), issuer=issuer.name, audiences=[issuer.audience],
                             algorithms=list(TOKEN_FIRST_SIGHT_BUDGET_S), clock_skew_s=60,
                             claims={"email": "email"}, jit_provisioning=False,
                             jwks=json.dumps(jwks(*issuer.keys.values())))]
    core.load(encode(config))
    now_s = TOKEN_NOW_MS // 1000
    tokens = {alg: issuer.token("u4321@example.com", key, None, iat=now_s, exp=now_s + 3600)
              for alg, key in issuer.keys.items()}
    return core, tokens, keys[4321]


@pytest.mark.parametrize("alg", list(TOKEN_FIRST_SIGHT_BUDGET_S))
def test_a_token_seen_first_verifies_within_its_algorithms_budget(benchmark, token_core, alg) -> None:  # type: ignore[no-untyped-def]
    """A first sight of a platform token (base64url, header and claims parsed, the signature
    verified with the issuer's key parsed once per snapshot, audience, expiry, the person by
    email), among 10 000 people: RS256 under 25 µs, ES256 under 100 µs, EdDSA under 60 µs."""
    core, tokens, _ = token_core
    principal, refused = core.verify_token(tokens[alg], TOKEN_NOW_MS, False)
    assert principal is not None and refused is None
    rounds = 5_000 if alg == "RS256" else 2_000
    _gate(benchmark, f"token_first_sight_{alg}", core.verify_token, TOKEN_FIRST_SIGHT_BUDGET_S[alg], rounds=rounds,
          every=50, args=(tokens[alg], TOKEN_NOW_MS, False))


def test_a_token_seen_before_authenticates_under_5us(benchmark, token_core) -> None:  # type: ignore[no-untyped-def]
    """A platform token seen before, through the request path's own authenticate: the verdict
    cache (one hash of the token, one comparison) and the person's status: under 5 µs."""
    core, tokens, key = token_core
    header = f"Bearer {tokens['RS256']}"
    principal = core.authenticate(header, None, None, None, TOKEN_NOW_MS)
    assert principal is not None and principal.token_issuer == "https://idp.example.com"
    assert core.authenticate(f"Bearer {key}", None, None, None, TOKEN_NOW_MS).id == principal.id
    _gate(benchmark, "token_cached", core.authenticate, TOKEN_CACHED_BUDGET_S, rounds=100_000, every=200,
          args=(header, None, None, None, TOKEN_NOW_MS))


IN_PROCESS_PATH_BUDGET_S = 1e-3


def _sse_events(n: int) -> bytes:
    """An OpenAI chat stream of n content deltas, a finish chunk, a usage chunk and [DONE]."""
    frames = [b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n']
    frames += [
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"word%d "}}]}\n\n' % i
        for i in range(n)
    ]
    frames.append(b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
    frames.append(b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d}}\n\n' % n)
    frames.append(b"data: [DONE]\n\n")
    return b"".join(frames)


@pytest.fixture
def path_core(tmp_path_factory: pytest.TempPathFactory) -> tuple[Core, str]:
    """A core on its own segment, 100 users, providers pointing at an unused local port; with
    the authorization header of one user."""
    segment = Segment.create(str(tmp_path_factory.mktemp("seg") / "path.seg"))
    segment.register()
    core = Core(PEPPER, segment)
    config, tokens = _config(100, core.hash_token)
    config.providers[0].base_url = "http://127.0.0.1:9/openai"
    config.providers[0].api_key = "sk-bench"
    config.providers[0].local = True
    core.load(encode(config))
    return core, f"Bearer {tokens[7]}"


def _upstream_chunks() -> list[bytes]:
    """200 OpenAI SSE deltas as the network delivers them: a few KiB per read."""
    upstream = _sse_events(200)
    return [upstream[i:i + 4096] for i in range(0, len(upstream), 4096)]


def test_in_process_proxy_path_under_1ms(benchmark, path_core) -> None:  # type: ignore[no-untyped-def]
    """authenticate + policy + render, parse 200 SSE deltas to NDJSON, price and charge: under 1 ms."""
    core, header = path_core
    body = b'{"query":"hello there, how are you today?","max_tokens":256}'
    chunks = _upstream_chunks()
    now_ms = 1_764_000_000_000

    def one_call() -> int:
        prepared = core.prepare("proxy", header, None, None, "model=bench-model-1", body, len(body), now_ms)
        assert prepared.status == 0
        exchange = prepared.exchange()
        sent = 0
        for chunk in chunks:
            sent += len(exchange.feed(chunk))
        last, _, _, _, _, _, input_nano, output_nano, *_ = exchange.finish(False, False, body)
        sent += len(last)
        core.charge(prepared.principal_id, prepared.model_id, input_nano + output_nano, now_ms)
        return sent

    assert one_call() > 200 * 20
    _gate(benchmark, "proxy_path", one_call, IN_PROCESS_PATH_BUDGET_S, rounds=2_000, every=2)


def test_in_process_entry_translation_under_1ms(benchmark, path_core) -> None:  # type: ignore[no-untyped-def]
    """An Anthropic Messages caller on an OpenAI-family model: authenticate, decode to the IR and
    encode for the provider, then translate 200 streamed deltas back into Anthropic events,
    price and charge: under 1 ms (about 2 µs a delta plus the fixed cost)."""
    core, header = path_core
    body = (b'{"model":"bench-model-1","max_tokens":256,"stream":true,"system":"be brief",'
            b'"messages":[{"role":"user","content":"hello there, how are you today?"}]}')
    chunks = _upstream_chunks()
    now_ms = 1_764_000_000_000

    def one_call() -> int:
        prepared = core.prepare("anthropic", header, None, None, "", body, len(body), now_ms)
        assert prepared.status == 0
        exchange = prepared.exchange()
        sent = 0
        for chunk in chunks:
            sent += len(exchange.feed(chunk))
        last, _, _, _, _, _, input_nano, output_nano, *_ = exchange.finish(False, False, body)
        sent += len(last)
        core.charge(prepared.principal_id, prepared.model_id, input_nano + output_nano, now_ms)
        return sent

    assert one_call() > 200 * 40
    _gate(benchmark, "entry_path", one_call, IN_PROCESS_PATH_BUDGET_S, rounds=1_000, every=2)


def calibration_s(repeats: int = 200) -> float:
    """The fastest of ``repeats`` runs of a fixed CPU-bound workload (interpreter dispatch, small
    allocations, hashing, all single-threaded like the gates): how fast this machine is now."""
    data = bytes(range(256)) * 4
    fastest = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        acc = 0
        for i in range(2_000):
            acc ^= hashlib.sha256(data[i % 64:]).digest()[0]
            acc += len(str(i)) + len({"k": i, "v": [i, i + 1]})
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


class _Reference:
    """A fixed workload run between a gate's rounds, never inside them: interpreter steps, small
    allocations, hashing and 64 reads at random across 64 MiB (the kinds of work the gates do,
    memory included). A shared machine's speed drifts by 2x within minutes (another tenant on the
    sibling hyperthread, memory bandwidth), for the gates and this workload alike; judged beside
    it, a gate measures the code rather than the minute it ran in."""

    _memory: bytearray | None = None

    def __init__(self) -> None:
        if _Reference._memory is None:
            _Reference._memory = bytearray(os.urandom(64 << 20))
        rnd = random.Random(11)
        self._reads = [rnd.randrange(0, 64 << 20) for _ in range(4096)]
        self._data = bytes(range(256)) * 4
        self._next = 0

    def run(self) -> int:
        memory, data = self._memory, self._data
        assert memory is not None
        acc = 0
        for i in range(20):
            acc ^= hashlib.sha256(data[i % 64:]).digest()[0]
            acc += len(str(i)) + len({"k": i, "v": [i, i + 1]})
        start = self._next
        self._next = (start + 64) % (len(self._reads) - 64)
        for at in self._reads[start:start + 64]:
            acc += memory[at]
        return acc


# A gate judged out of bounds is measured again, up to this many times in all: a regression
# fails every attempt, a minute of a noisy neighbour rarely spans three.
GATE_ATTEMPTS = 3


def _measure(call, args: tuple, rounds: int, every: int, warmup: int,  # type: ignore[no-untyped-def]
             benchmark=None) -> tuple[list[float], list[float]]:
    """(round times, reference times): ``call(*args)`` timed round by round, the reference
    workload run (and timed apart) before every ``every``-th round after the warm-up. Through
    pytest-benchmark (its report) when ``benchmark`` is given."""
    reference = _Reference()
    samples: list[float] = []
    count = 0

    def between() -> None:
        nonlocal count
        if count >= warmup and count % every == 0:
            started = time.perf_counter()
            reference.run()
            samples.append(time.perf_counter() - started)
        count += 1

    if benchmark is not None:
        benchmark.pedantic(call, args=args, setup=between, rounds=rounds, iterations=1, warmup_rounds=warmup)
        return list(benchmark.stats.stats.data), samples
    clock = time.perf_counter
    times: list[float] = []
    # NOTE: without the collector, as pytest-benchmark runs the first attempt (--benchmark-disable-gc).
    collecting = gc.isenabled()
    gc.disable()
    try:
        for i in range(warmup + rounds):
            between()
            started = clock()
            call(*args)
            elapsed = clock() - started
            if i >= warmup:
                times.append(elapsed)
    finally:
        if collecting:
            gc.enable()
    return times, samples


def _judge(name: str, budget_s: float, times: list[float], samples: list[float]) -> list[str]:
    """What is out of bounds in one attempt (nothing: it passes). Each bound is scaled by how much
    slower the reference ran than when the baseline was recorded (at the machine's quietest; never
    below 1, so a faster machine keeps the recorded bounds)."""
    base = BASELINE_REFERENCE[name]
    median, fastest_run = statistics.median(times), min(times)
    typical = max(1.0, statistics.median(samples) / base["median_s"])
    fastest = max(1.0, min(samples) / base["min_s"])
    print(f"{name}: median {median * 1e6:.2f} us (budget {budget_s * typical * 1e6:.2f}), fastest "
          f"{fastest_run * 1e6:.2f} us (bound {BASELINE[name] * REGRESSION_BOUND * fastest * 1e6:.2f}); reference "
          f"median {statistics.median(samples) * 1e6:.1f} us, fastest {min(samples) * 1e6:.1f} us")
    problems = []
    if median >= budget_s * typical:
        problems.append(f"median {median * 1e6:.2f} us over the budget {budget_s * 1e6:.2f} us (x{typical:.2f}: the "
                        f"reference ran {statistics.median(samples) * 1e6:.1f} us, {base['median_s'] * 1e6:.1f} us in "
                        f"the baseline)")
    if median > BASELINE_MEDIAN[name] * REGRESSION_BOUND * typical:
        problems.append(f"median {median * 1e6:.2f} us over {REGRESSION_BOUND}x the baseline's "
                        f"{BASELINE_MEDIAN[name] * 1e6:.2f} us (x{typical:.2f})")
    if fastest_run > BASELINE[name] * REGRESSION_BOUND * fastest:
        problems.append(f"fastest round {fastest_run * 1e6:.2f} us over {REGRESSION_BOUND}x the baseline's "
                        f"{BASELINE[name] * 1e6:.2f} us (x{fastest:.2f})")
    return problems


def _gate(benchmark, name: str, call, budget_s: float, rounds: int, every: int,  # type: ignore[no-untyped-def]
          args: tuple = (), fresh=None) -> None:
    """Times ``call(*args)`` beside the reference workload (see _measure) and checks, each bound
    scaled by the reference (see _judge):

    - the budget: the median round under ``budget_s``;
    - regression: the median round and the fastest one at most REGRESSION_BOUND times the
      baseline's (a cost on most calls, or on every one).

    Out of bounds, it measures again (GATE_ATTEMPTS in all; ``fresh()`` first, for a call whose
    rounds leave state behind); it fails when every attempt does.
    """
    warmup = min(rounds // 10, 500)
    times, samples = _measure(call, args, rounds, every, warmup, benchmark)
    if _RECORD:
        _RECORDED["min_s"][name] = min(times)
        _RECORDED["median_s"][name] = statistics.median(times)
        _RECORDED["reference"][name] = {"median_s": statistics.median(samples), "min_s": min(samples)}
        Path(_RECORD).write_text(json.dumps(_RECORDED, indent=1) + "\n")
        return
    failures = []
    for attempt in range(GATE_ATTEMPTS):
        if attempt:
            if fresh is not None:
                fresh()
            times, samples = _measure(call, args, rounds, every, warmup)
        problems = _judge(name, budget_s, times, samples)
        if not problems:
            return
        failures.append(f"attempt {attempt + 1}: " + "; ".join(problems))
    raise AssertionError(f"{name}: out of bounds in every attempt:\n" + "\n".join(failures))


_SLOWDOWN: list[float] = []


def _slowdown() -> float:
    """How much slower this machine runs the calibration workload than the one that recorded the
    baseline (1.0 when it is as fast or faster): a slower machine must not fail the gates, a
    faster one must not hide a regression. Measured once per run."""
    if not _SLOWDOWN:
        _SLOWDOWN.append(max(1.0, min(calibration_s() for _ in range(3)) / BASELINE_CALIBRATION_S))
    return _SLOWDOWN[0]


# --- spend rules at scale (issue "spend rules": the decision stays within 10 µs) -----------------

RULE_DECISION_BUDGET_S = 10e-6
RULES_USERS, RULES_MODELS, RULES_COUNT, GRANTS_PER_USER = 100_000, 200, 100, 10


def _rules_config(core_hash, keyed: int = 200,  # type: ignore[no-untyped-def]
                  every_grant: bool = False) -> tuple[Config, list[tuple[str, str]]]:
    """100 rules of 2 entries over 200 models (20 tags and one on every model), 100 000 people
    in a reporting tree across 50 business units and 3 tiers, 10 grants each (1 000 000 pairs).
    Returns the config and (authorization, model query) for the first ``keyed`` people (who hold
    keys): one of their models each, or every one with ``every_grant``."""
    import random

    from meshfast.snapshot import Rule, RuleAction, RuleEntry

    rnd = random.Random(7)
    providers = [Provider(id=str(uuid.uuid4()), name="bench", family="openai", max_calls_per_hour=None,
                          supports_web_search=False, base_url="http://127.0.0.1:9/openai", api_key="sk-bench",
                          local=True)]
    models = [
        Model(id=str(uuid.uuid4()), name=f"m{i}", provider=0, resolved_model="gpt-bench", max_output_tokens=4096,
              price_per_second_nano=0, kind="chat", created_ms=0, blocked=False, status="active",
              supports_image_in=False, supports_document_in=False, supports_audio_in=False,
              supports_video_in=False, supports_web_search=False, output_media_type=None,
              input_price_nano_per_1k=1_000_000, output_price_nano_per_1k=2_000_000, tags=[f"fam{i % 20}", "all"])
        for i in range(RULES_MODELS)
    ]
    tiers, units = ["normal", "senior", "exec"], [f"bu{i}" for i in range(50)]
    principals, keys, grants, callers = [], [], [], []
    for i in range(RULES_USERS):
        if i < keyed:
            token, _ = new_mesh_key()
            digest = core_hash(token)
        else:
            token, digest = "", hashlib.sha256(b"%d" % i).digest()
        principals.append(Principal(id=str(uuid.uuid4()), email=f"u{i}@example.com", display_name="U",
                                    status="active", expires_at_ms=None,
                                    manager=None if i < 10 else rnd.randrange(0, i),
                                    business_unit=units[i % 50], tier=tiers[i % 3]))
        keys.append(Key(id=str(uuid.uuid4()), principal=i, digest=digest, status="active", expires_at_ms=None))
        mine = rnd.sample(range(RULES_MODELS), GRANTS_PER_USER)
        grants += [Grant(principal=i, model=m, daily_cap_nano_usd=20_000_000_000, max_calls_per_hour=None,
                         allowed_from_min=None, allowed_to_min=None, timezone="UTC", active_days=[],
                         always_open=False) for m in mine]
        if token:
            callers += [(f"Bearer {token}", f"model=m{m}") for m in (mine if every_grant else mine[:1])]
    rules = [
        Rule(id=f"rule-{r}", weight=r, mode="shadow" if r % 7 == 0 else "enforce", entries=[
            RuleEntry(window=("daily", "weekly", "monthly")[(r + e) % 3],
                      actions=[RuleAction(type="block"), RuleAction(type="warn", text="near the cap")],
                      tiers=[tiers[r % 3]] if r % 2 else [], leaders=[rnd.randrange(0, 1000)] if r % 4 == 0 else [],
                      business_units=[units[r % 50]] if r % 5 == 0 else [],
                      tag="all" if r % 10 == 0 else f"fam{r % 20}", threshold_nano=(r + 1) * 1_000_000_000)
            for e in range(2)])
        for r in range(RULES_COUNT)
    ]
    # As a worker's rebuild hands them to the core (snapshot.build_config): one packed table over
    # the distinct terms, not a million maps.
    from meshfast.snapshot import GRANT_RECORD, GrantTable, GrantTerms

    terms = GrantTerms(daily_cap_nano_usd=20_000_000_000, max_calls_per_hour=None, allowed_from_min=None,
                       allowed_to_min=None, timezone="UTC", active_days=[], always_open=False)
    table = GrantTable(packed=b"".join(GRANT_RECORD.pack(g.principal, g.model, 0) for g in grants), terms=[terms])
    return Config(seq=1, kill_switch=False, principals=principals, keys=keys, providers=providers, models=models,
                  grants=[], grant_table=table, rules=rules), callers


@pytest.fixture(scope="module")
def rules_core(tmp_path_factory: pytest.TempPathFactory) -> tuple[Core, list[tuple[str, str]], float]:
    """The large config loaded; the time is the faster of the first load and a rebuild over it (a
    worker's rebuild replaces a live snapshot; one wall-clock sample on two shared cores is noise)."""
    segment = Segment.create(str(tmp_path_factory.mktemp("seg") / "rules.seg"))
    segment.register()
    core = Core(PEPPER, segment)
    config, callers = _rules_config(core.hash_token)
    data = encode(config)
    fastest = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        core.load(data)
        fastest = min(fastest, time.perf_counter() - started)
    return core, callers, fastest


def test_rule_decision_under_10us(benchmark, rules_core) -> None:  # type: ignore[no-untyped-def]
    """One call's whole decision (authenticate, grant, policy, 100 rules' entries covering the model
    with their pool reservations, render) and its settle, with 100 rules, 100 000 people, 200
    models and 1 000 000 grants loaded: median under 10 µs."""
    core, callers, _ = rules_core
    body = b'{"query":"hello there, how are you today?","max_tokens":256}'
    # Each attempt in a month of its own: the spend the rounds settle never meets a rule's cap.
    clock = {"now_ms": 1_764_000_000_000}
    calls = itertools.cycle(callers)

    def one_call() -> None:
        header, query = next(calls)
        prepared = core.prepare("proxy", header, None, None, query, body, len(body), clock["now_ms"])
        assert prepared.status == 0, prepared.deny_reason
        prepared.settle(1_000, 10)

    def next_month() -> None:
        clock["now_ms"] += 32 * 86_400_000

    _gate(benchmark, "rule_decision", one_call, RULE_DECISION_BUDGET_S, rounds=20_000, every=20, fresh=next_month)


def test_full_rebuild_of_the_large_snapshot_under_2s(rules_core) -> None:  # type: ignore[no-untyped-def]
    """Building the core's snapshot of that config (the part of a rebuild after the database read)."""
    _, _, load_s = rules_core
    assert load_s < 2.0 * _slowdown(), f"core.load took {load_s:.2f} s"


# --- shared memory at a million active pairs (issue 14 "Speed": ≤ 256 MB) -------------------------

SHM_GOAL_BYTES = 256 * 1024 * 1024
# MESHFAST_SHM_SLOTS as the settings' help sizes it for a million active pairs (about 7.2 per pair).
MILLION_PAIRS_SLOTS = 7_200_000
# The supervisor's default ring (MESHFAST_TELEMETRY_RING_ROWS).
DEFAULT_RING_ROWS = 8192


def test_a_million_active_pairs_fit_in_256_mib(tmp_path: Path) -> None:
    """All 1 000 000 person × model pairs of the large config (100 000 people, each with a key and
    10 models, 100 rules) make a call and the leader checkpoints them: the segment the supervisor
    creates with MESHFAST_SHM_SLOTS=7200000 and the default ring holds every counter with its
    shadow, below 90 % occupancy, in at most 256 MiB. (The decision's time at that occupancy, a
    figure and not a gate here, is printed and measured by ``bench/rules_bench.py``.)"""
    import statistics

    from meshfast import counters
    from meshfast._core import counter_key

    path = tmp_path / "million.seg"
    segment = Segment.create(str(path), slots=MILLION_PAIRS_SLOTS, ring_records=DEFAULT_RING_ROWS)
    segment.register()
    core = Core(PEPPER, segment)
    config, callers = _rules_config(core.hash_token, keyed=RULES_USERS, every_grant=True)
    assert len(callers) == RULES_USERS * GRANTS_PER_USER
    core.load(encode(config))
    body = b'{"query":"hello there, how are you today?","max_tokens":256}'
    now_ms = int(time.time() * 1000)
    started = time.perf_counter()
    for header, query in callers:
        prepared = core.prepare("proxy", header, None, None, query, body, len(body), now_ms)
        assert prepared.status == 0, prepared.deny_reason
        prepared.settle(1_000, 10)
    first_calls_s = time.perf_counter() - started
    # The leader's checkpoint: each moved counter's shadow takes what was pushed.
    pairs, providers = counters._periods_of(config, now_ms)
    moved = core.counter_deltas(pairs, providers)
    assert len(moved) >= 3 * len(callers), len(moved)
    for kind, a, b, period, delta in moved:
        segment.add_shadow(counter_key(kind, a, b, period), delta)
    assert core.counter_deltas(pairs, providers) == [], "every counter checkpointed"

    stats = segment.stats()
    size = path.stat().st_size
    load = stats["slots_used"] / stats["slots"]
    samples = []
    for header, query in callers[7::100]:
        t0 = time.perf_counter_ns()
        prepared = core.prepare("proxy", header, None, None, query, body, len(body), now_ms)
        prepared.settle(1_000, 10)
        samples.append(time.perf_counter_ns() - t0)
        assert prepared.status == 0, prepared.deny_reason
    median_us = statistics.median(samples) / 1000
    print(f"\nmillion active pairs: segment {size / 2**20:.1f} MiB ({size / 1e6:.1f} MB), "
          f"{stats['slots_used']} of {stats['slots']} slots ({load:.1%}), "
          f"{stats['slots_used'] / len(callers):.2f} per pair; first calls {first_calls_s:.1f} s; "
          f"decision median {median_us:.2f} us")
    assert size <= SHM_GOAL_BYTES, f"{size / 2**20:.1f} MiB"
    assert load < 0.9, f"{load:.1%} of the slots used: probes grow long"


# --- a full rebuild beyond the database read (issue 14 "Speed": ≤ 2 s) -----------------------------

REBUILD_BUDGET_S = 2.0


def _rebuild_rows() -> dict[str, object]:
    """What ``fetch_config`` returns for 100 rules, 100 000 people (a reporting tree, each with a
    key), 200 models and 1 000 000 grants (10 each, one in ten with a policy of its own): rows
    as asyncpg gives them (mappings), the grants packed as SNAPSHOT_GRANT_TABLE packs them."""
    import datetime as dt
    import random
    from decimal import Decimal

    from meshfast.sealing import seal
    from meshfast.snapshot import GRANT_RECORD

    rnd = random.Random(11)
    provider_id = uuid.uuid4()
    sealed, nonce = seal(PEPPER, str(provider_id), "sk-bench")
    providers = [{"id": provider_id, "name": "bench", "family": "openai", "base_url": "http://127.0.0.1:9/openai",
                  "encrypted_api_key": sealed, "key_nonce": nonce, "local": True, "max_outbound_rps": None,
                  "max_concurrent_upstream": None, "max_calls_per_hour": None, "retry_enabled": True,
                  "max_retries": 2, "retry_backoff_ms": 200, "log_requests": True, "supports_web_search": False,
                  "settings": {}}]
    models = sorted(({
        "id": uuid.uuid4(), "provider_id": provider_id, "name": f"m{i}", "resolved_model": "gpt-bench", "kind": "chat",
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "blocked": False, "status": "active",
        "max_output_tokens": 4096, "price_per_second": Decimal(0), "supports_image_in": False,
        "supports_document_in": False, "supports_audio_in": False, "supports_video_in": False,
        "supports_web_search": False, "output_media_type": None, "input_price_per_1k_tokens": Decimal("0.001"),
        "output_price_per_1k_tokens": Decimal("0.002"), "cache_read_price_per_1k_tokens": None,
        "cache_write_price_per_1k_tokens": None, "cache_write_1h_price_per_1k_tokens": None,
        "long_context_threshold_tokens": None, "long_context_prices": None, "aliases": [],
        "tags": [f"fam{i % 20}", "all"], "restrictions": None} for i in range(RULES_MODELS)), key=lambda m: m["id"])
    ids = sorted(str(uuid.uuid4()) for _ in range(RULES_USERS))
    tiers = ["normal", "senior", "exec"]
    users = [{"id": ids[i], "email": f"u{i}@example.com", "display_name": f"U {i}", "status": "active",
              "expires_at": None, "manager_id": None, "manager": None if i < 10 else rnd.randrange(0, i),
              "business_unit": f"bu{i % 50}", "tier": tiers[i % 3]} for i in range(RULES_USERS)]
    keys = [{"id": str(uuid.uuid4()), "principal": i, "key_hash": hashlib.sha256(b"%d" % i).digest(),
             "status": "active", "expires_at": None} for i in range(RULES_USERS)]
    grant_terms = [{"k": 0, "daily_cap_usd": Decimal("20.00"), "max_calls_per_hour": None, "allowed_from": None,
                    "allowed_to": None, "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": False}]
    grant_terms += [{"k": k, "daily_cap_usd": Decimal(k), "max_calls_per_hour": 100 if k % 2 else None,
                     "allowed_from": dt.time(8) if k % 3 == 0 else None, "allowed_to": dt.time(18) if k % 3 == 0 else None,
                     "timezone": ("UTC", "Europe/Paris", "America/New_York")[k % 3], "active_days": [1, 2, 3, 4, 5],
                     "always_open": k % 5 == 0} for k in range(1, 10)]
    packed = b"".join(GRANT_RECORD.pack(i, m, rnd.randrange(1, 10) if rnd.random() < 0.1 else 0)
                      for i in range(RULES_USERS) for m in rnd.sample(range(RULES_MODELS), GRANTS_PER_USER))
    rules = [{"id": f"rule-{r}", "body": {"id": f"rule-{r}", "weight": r, "mode": "shadow" if r % 7 == 0 else "enforce",
              "entries": [{"population": {"tiers": [tiers[r % 3]]} if r % 2 else {},
                           "scope": {"tag": "all" if r % 10 == 0 else f"fam{r % 20}"},
                           "window": ("daily", "weekly", "monthly")[(r + e) % 3], "threshold_usd": str(r + 1),
                           "actions": [{"type": "block"}, {"type": "warn", "text": "near the cap"}]}
                          for e in range(2)]}} for r in range(RULES_COUNT)]
    return {"seq": 1, "kill_switch": False, "users": users, "keys": keys, "providers": providers, "models": models,
            "deployments": [], "grants": packed, "grant_terms": grant_terms, "enforce_rules": True, "rules": rules}


def test_full_rebuild_beyond_the_database_under_2s() -> None:
    """A worker's whole rebuild after the database read (``ConfigFeed.rebuild``: the config from
    the rows, its bytes, the core's snapshot live) for 100 rules, 100 000 people, 200 models and
    1 000 000 grants: under 2 s (fastest of two)."""
    from meshfast.snapshot import build_config

    rows = _rebuild_rows()
    fastest, stages = float("inf"), ""
    for _ in range(2):
        core = Core(PEPPER)
        started = time.perf_counter()
        config = build_config(rows, PEPPER)
        built = time.perf_counter()
        data = encode(config)
        encoded = time.perf_counter()
        core.load(data)
        loaded = time.perf_counter()
        assert config.grant_table is not None and len(config.grant_table) == RULES_USERS * GRANTS_PER_USER
        if loaded - started < fastest:
            fastest = loaded - started
            stages = (f"build {built - started:.2f} s, encode {encoded - built:.2f} s ({len(data) / 1e6:.0f} MB), "
                      f"load {loaded - encoded:.2f} s")
        del core, config, data
    print(f"full rebuild beyond the database: {fastest:.2f} s ({stages})")
    assert fastest < REBUILD_BUDGET_S * _slowdown(), f"the rebuild took {fastest:.2f} s: {stages}"
