"""The data protection test corpus: for every built-in detector and one operator pattern, values a
detector must find (each whole, as written) and near misses it must let pass (a bad checksum, a
wrong length or grouping, a reserved range, a shape that is not the thing). `test_dlp_formats.py`
holds the corpus against the scanner, then sends it through every entry format.

The values are kept short on purpose: testserve echoes at most 400 characters of a prompt and 200
of a tool result, and an echo cut short would differ between a call and its pseudonymized twin."""

from __future__ import annotations

import json
import re

# The operator's own detector, as a policy's `custom` entry declares it.
CUSTOM = {"name": "ticket", "pattern": r"\bTCK-\d{6}\b"}

CARD = "4111 1111 1111 1111"
NEAR_CARD = "4111 1111 1111 1112"  # fails Luhn
IBAN = "DE89 3704 0044 0532 0130 00"
SECRET = "AKIAIOSFODNN7EXAMPLE"
PRIVATE_KEY = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----"
JWT = "eyJhbGciOiJ9.eyJzdWIiOjF9.abcdefghij"

VALID: dict[str, tuple[str, ...]] = {
    "card": (CARD, "5500-0000-0000-0004", "378282246310005"),  # spaces, hyphens, Amex ungrouped
    "iban": (IBAN, "GB82WEST12345698765432"),
    "email": ("ada.lovelace+news@example.co.uk",),
    "phone": ("+44 20 7946 0958", "+14155552671", "020 7946 0958", "(415) 555-2671"),  # E.164, national
    "ssn": ("123-45-6789", "123 45 6789"),
    "ip": ("192.168.10.254", "2001:db8::8a2e:370:7334"),
    "secret": (SECRET, "ghp_R2vQx7Lm9TzKp4WcYb8NdJ3sHfGaEuVkXoPq", "sk-proj-abc123defghijklmnopqrstu", JWT,
               PRIVATE_KEY),
    "ticket": ("TCK-123456",),
}

NEAR_MISSES: dict[str, tuple[str, ...]] = {
    "card": (NEAR_CARD, "1111 1111 1111 1117",  # a valid Luhn digit, but no card starts with 1
             "4111 11111 1111 111",  # 16 digits, Luhn-valid, grouped as no card prints them
             "4111 1111 1111"),  # 12 digits: too short
    "iban": ("DE89 3704 0044 0532 0130 01", "GB82WEST1234569876543"),  # checksum; one character short
    "email": ("ada@example", "ada.example.com", "mail me@"),
    "phone": ("+44 20 79", "020 7946 09"),  # too few digits
    "ssn": ("000-12-3456", "666-12-3456", "900-12-3456", "123-00-4567", "123-45-0000"),  # never issued
    "ip": ("999.1.1.1", "256.1.1.1", "192.168.1", "2001:db8::8a2e::7334", "std::vec::Vec"),
    "secret": ("AKIAIOSFODNN7EXAMPL", "ghp_short123", "sk-learn-compatible", "sk-abc123",
               "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0",  # two parts: not a JWT
               "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----"),
    "ticket": ("TCK-12345", "TCK-1234567"),
}

DETECTORS = tuple(VALID)


def custom_matches(text: str) -> list[str]:
    """The operator pattern's matches in ``text`` (the scanner's Rust regex reads it the same)."""
    return re.findall(CUSTOM["pattern"], text)


def escaped(value: str) -> str:
    """``value`` as it appears inside a JSON string (a recorded request body)."""
    return json.dumps(value)[1:-1]


def near_miss_text() -> str:
    """Every near miss, in one text."""
    return "; ".join(v for values in NEAR_MISSES.values() for v in values)
