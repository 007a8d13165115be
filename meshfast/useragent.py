"""User-agent parsing for request rows: browser, OS and device type.

Runs in the telemetry drainer, off the request path. Covers the clients a gateway sees: the
official SDKs and HTTP libraries, the major browsers, and bots.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple


class Device(NamedTuple):
    browser: str | None
    browser_version: str | None
    os: str | None
    os_version: str | None
    device_type: str | None


# Order matters: the first match wins (Edge and Opera announce Chrome too; Chrome announces Safari).
_BROWSERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("OpenAI SDK", r"OpenAI/(?:Python|JS) ([\d.]+)"),
        ("Anthropic SDK", r"Anthropic/(?:Python|JS) ([\d.]+)"),
        ("Google GenAI SDK", r"google-genai-sdk/([\d.]+)"),
        ("python-requests", r"python-requests/([\d.]+)"),
        ("python-httpx", r"python-httpx/([\d.]+)"),
        ("aiohttp", r"aiohttp/([\d.]+)"),
        ("curl", r"curl/([\d.]+)"),
        ("node-fetch", r"node-fetch/([\d.]+)"),
        ("Go-http-client", r"Go-http-client/([\d.]+)"),
        ("Edge", r"Edg(?:e|A|iOS)?/([\d.]+)"),
        ("Opera", r"(?:OPR|Opera)/([\d.]+)"),
        ("Firefox", r"(?:Firefox|FxiOS)/([\d.]+)"),
        ("Chrome", r"(?:Chrome|CriOS)/([\d.]+)"),
        ("Safari", r"Version/([\d.]+).*Safari/"),
    )
)
_OSES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("iOS", r"(?:iPhone|iPad|iPod).*? OS ([\d_]+)"),
        ("Android", r"Android ?([\d.]*)"),
        ("Windows", r"Windows NT ([\d.]+)"),
        ("macOS", r"Mac OS X ([\d_.]+)"),
        ("ChromeOS", r"CrOS \S+ ([\d.]+)"),
        ("Linux", r"Linux()"),
    )
)
_BOT = re.compile(r"bot|crawler|spider|crawling|slurp|headless", re.IGNORECASE)


@lru_cache(maxsize=4096)
def parse(user_agent: str | None) -> Device:
    if not user_agent:
        return Device(None, None, None, None, None)
    browser = browser_version = os_name = os_version = None
    for name, pattern in _BROWSERS:
        match = pattern.search(user_agent)
        if match:
            browser, browser_version = name, match.group(1)
            break
    for name, pattern in _OSES:
        match = pattern.search(user_agent)
        if match:
            os_name, os_version = name, (match.group(1).replace("_", ".") or None)
            break
    if _BOT.search(user_agent):
        device_type = "bot"
    elif "iPad" in user_agent or ("Android" in user_agent and "Mobile" not in user_agent):
        device_type = "tablet"
    elif "Mobile" in user_agent or "iPhone" in user_agent:
        device_type = "mobile"
    elif os_name is None:
        device_type = "other"
    else:
        device_type = "desktop"
    return Device(browser, browser_version, os_name, os_version, device_type)
