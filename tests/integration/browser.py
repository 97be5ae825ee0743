"""A page of `torchherd show` opened in headless Chromium (selenium, with the system's
chromedriver: nothing is downloaded at test time), what its console said, and what its
screenshots show (PNG read with the standard library)."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 1000)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium whose console messages are kept (``driver.get_log('browser')``)."""
    if not os.access(CHROMEDRIVER, os.X_OK):
        pytest.fail(f"expected {CHROMEDRIVER}, found none; fix: scripts/install-system-deps.sh "
                    f"(chromium, chromium-driver)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    # No sandbox: it cannot start as root, nor where a container gives no user namespaces.
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-extensions", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, path: Path) -> float:
    """Open a file; the seconds from the navigation's start to the page's load event."""
    driver.get(path.resolve().as_uri())
    return driver.execute_script(
        "const t = performance.getEntriesByType('navigation')[0];"
        "return (t.loadEventEnd - t.startTime) / 1000;")


def severe(driver: Any) -> list[dict[str, Any]]:
    """The console's errors since the last call (a script's, a resource that did not load)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def png_pixels(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, pixels row after row) of an 8-bit RGB or RGBA PNG that
    is not interlaced, as Chromium writes its screenshots."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, bytearray(), None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    if header is None or header[2] != 8 or header[3] not in (2, 6) or header[6]:
        raise ValueError(f"PNG: expected 8-bit RGB(A), not interlaced, found header {header}")
    width, height, bpp = header[0], header[1], 3 if header[3] == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * bpp
    out, prev = bytearray(), bytearray(stride)
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                near = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + near) & 0xFF
        out += line
        prev = line
    return width, height, bpp, bytes(out)


def colours(png: bytes) -> set[tuple[int, int, int]]:
    """The colours of a screenshot's pixels."""
    width, height, bpp, pixels = png_pixels(png)
    return {tuple(pixels[i:i + 3]) for i in range(0, width * height * bpp, bpp)}  # type: ignore[misc]


def near(found: set[tuple[int, int, int]], colour: str, within: int = 6) -> bool:
    """Whether a colour close to ``colour`` (#rrggbb) is among those found."""
    want = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return any(all(abs(a - b) <= within for a, b in zip(c, want, strict=True)) for c in found)
