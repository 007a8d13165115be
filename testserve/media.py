"""Media bytes served by testserve, built in memory at import (no files on disk)."""

from __future__ import annotations

import struct
import zlib


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_1x1() -> bytes:
    # 1×1 RGBA, one transparent white pixel: 70 bytes, the size mesh-behaviour §8 names.
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\xff\xff\x00", 9)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _mp4() -> bytes:
    # ftyp/free/mdat boxes: recognised as MP4 by sniffers, not playable.
    ftyp = _box(b"ftyp", b"isom" + struct.pack(">I", 512) + b"isomiso2avc1mp41")
    return ftyp + _box(b"free", b"") + _box(b"mdat", b"testserve-video" * 16)


def _wav() -> bytes:
    # 200 ms of 8 kHz mono 16-bit silence.
    rate, n = 8000, 1600
    data = b"\x00\x00" * n
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)


def _pdf() -> bytes:
    return (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
            b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
            b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 72 72]>>endobj\n"
            b"trailer<</Root 1 0 R>>\n%%EOF\n")


PNG = _png_1x1()
MP4 = _mp4()
WAV = _wav()
PDF = _pdf()

FILES: dict[str, tuple[str, bytes]] = {
    "dummy.png": ("image/png", PNG),
    "dummy.mp4": ("video/mp4", MP4),
    "dummy.wav": ("audio/wav", WAV),
    "dummy.pdf": ("application/pdf", PDF),
}
