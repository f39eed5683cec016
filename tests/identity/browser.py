"""Drive the test provider's pages over HTTP, as a browser would (no JavaScript needed)."""

from __future__ import annotations

import re
from urllib.parse import urljoin

import httpx


async def follow_until(browser: httpx.AsyncClient, url: str, stop_prefix: str) -> str:
    """GET ``url`` and follow redirects until one points at ``stop_prefix``; return that URL.

    The callback itself is never requested: the test hands its query to the
    code under test, as the REST layer will.
    """
    for _ in range(20):
        response = await browser.get(url)
        if response.status_code not in (302, 303):
            raise AssertionError(
                f"expected a redirect from {url}, got {response.status_code}: {response.text[:300]}"
            )
        url = urljoin(str(response.url), response.headers["location"])
        if url.startswith(stop_prefix):
            return url
    raise AssertionError("too many redirects")


async def approve_device(
    browser: httpx.AsyncClient, verification_uri_complete: str, account: str = "alice"
) -> str:
    """Submit the provider's device pages (auto-submit form, confirmation form) and log
    ``account`` in through the interaction route; returns the final page text."""
    response = await browser.get(verification_uri_complete)
    for _ in range(20):
        if response.status_code in (302, 303):
            location = urljoin(str(response.url), response.headers["location"])
            if "/interaction/" in location:
                location += f"?account={account}"
            response = await browser.get(location)
            continue
        action = re.search(r'<form[^>]*action="([^"]+)"', response.text)
        if action is None or 'id="op.deviceInputForm"' in response.text:
            return response.text  # done, or the provider asks for the code again
        fields = dict(
            re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', response.text)
        )
        response = await browser.post(urljoin(str(response.url), action.group(1)), data=fields)
    raise AssertionError("the device pages did not finish")
