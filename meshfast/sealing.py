"""Provider keys sealed with AES-256-GCM under the master key.

A fresh 12-byte nonce per seal; the provider id is the associated data, so a sealed key copied
onto another provider's row does not open.
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def seal(master_key: bytes, provider_id: str, api_key: str) -> tuple[bytes, bytes]:
    nonce = os.urandom(12)
    return AESGCM(master_key).encrypt(nonce, api_key.encode(), provider_id.encode()), nonce


def open_sealed(master_key: bytes, provider_id: str, sealed: bytes, nonce: bytes) -> str:
    return AESGCM(master_key).decrypt(nonce, sealed, provider_id.encode()).decode()
