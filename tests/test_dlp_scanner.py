"""The data protection scanner against slow, obvious references (Hypothesis): every Luhn-valid card
number and every checksum-valid IBAN is found wherever it sits in arbitrary text, a one-digit
change is never reported as one, and arbitrary text never crashes or hangs the scanner."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from meshfast._core import dlp_scan


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, d in enumerate(reversed(digits)):
        n = int(d) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def with_check_digit(body: str) -> str:
    return next(body + str(c) for c in range(10) if luhn_ok(body + str(c)))


def iban_ok(text: str) -> bool:
    s = text.replace(" ", "")
    rearranged = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def make_iban(country: str, bban: str) -> str:
    check = 98 - int("".join(str(int(c, 36)) for c in bban + country + "00")) % 97
    return f"{country}{check:02d}{bban}"


filler = st.text(alphabet=st.sampled_from("abc xyz.,;:!?()-\n"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(before=filler, after=filler, lead=st.sampled_from("23456"), body=st.text("0123456789", min_size=14,
                                                                                  max_size=14),
       grouped=st.booleans())
def test_every_valid_card_is_found_and_a_changed_digit_never_is(before: str, after: str, lead: str, body: str,
                                                                 grouped: bool) -> None:
    number = with_check_digit(lead + body)
    shown = " ".join(number[i:i + 4] for i in range(0, 16, 4)) if grouped else number
    text = f"{before} {shown} {after}"
    found = [text[s:e] for d, s, e in dlp_scan(text) if d == "card"]
    assert shown in found, (text, found)
    changed = number[:-1] + str((int(number[-1]) + 1) % 10)
    assert not luhn_ok(changed)
    text = f"{before} {changed} {after}"
    assert not any(d == "card" for d, _, _ in dlp_scan(text)), text


@settings(max_examples=200, deadline=None)
@given(before=filler, after=filler, country=st.sampled_from(["DE", "GB", "FR", "NL", "ES"]),
       bban=st.text("0123456789", min_size=16, max_size=22))
def test_every_checksum_valid_iban_is_found(before: str, after: str, country: str, bban: str) -> None:
    iban = make_iban(country, bban)
    assert iban_ok(iban)
    text = f"{before} {iban} {after}"
    assert iban in [text[s:e] for d, s, e in dlp_scan(text) if d == "iban"], text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_arbitrary_text_scans_quickly_into_ordered_disjoint_matches(text: str) -> None:
    started = time.perf_counter()
    found = dlp_scan(text)
    assert time.perf_counter() - started < 0.5
    at = 0
    for _, start, end in found:
        assert at <= start < end <= len(text)
        at = end


def test_the_corpus_in_bench_finds_what_it_hides() -> None:
    from pathlib import Path

    corpus = (Path(__file__).resolve().parent.parent / "bench" / "dlp-corpus.txt").read_text()
    kinds = {d for d, _, _ in dlp_scan(corpus)}
    assert kinds >= {"card", "iban", "email", "phone", "ssn", "ip", "secret"}, kinds
    for near_miss in ("4111 1111 1111 1112", "DE89 3704 0044 0532 0130 01", "000-12-3456"):
        for d, s, e in dlp_scan(corpus):
            assert corpus[s:e] != near_miss, (d, near_miss)
    assert re.search(r"4111 1111 1111 1111", corpus)
