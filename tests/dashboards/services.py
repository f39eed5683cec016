"""Read a service's /metrics page as a real scraper does.

The dashboards test (``test_dashboards_prometheus``) starts the real
services and lets a real Prometheus scrape them; it also reads each
process's first page itself, before any traffic, to check that counters
exist at 0 from the start. This is that reading: an HTTP GET (with
credentials for mgmt-api) and a parse of the text exposition into samples.
"""

from __future__ import annotations

import re

import httpx

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{.*\})?\s")
_LABEL = re.compile(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"')

# Sample name and its label set -> value.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, auth: tuple[str, str] | None = None) -> str:
    response = httpx.get(url, auth=auth, timeout=10)
    response.raise_for_status()
    return response.text


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and label set."""
    found: Samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and (m := _SAMPLE.match(line)):
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            found[(m.group(1), labels)] = float(line.rsplit(" ", 1)[1])
    return found
