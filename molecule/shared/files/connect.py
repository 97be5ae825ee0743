"""Open a TCP connection to every HOST:PORT given, all at once, with a timeout of TIMEOUT s.

    python3 connect.py TIMEOUT HOST:PORT...

Prints one JSON object: {"open": [HOST:PORT that connected], "closed": {HOST:PORT: error}}.
"""

import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor


def attempt(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=float(sys.argv[1])).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


targets = sys.argv[2:]
with ThreadPoolExecutor(max(len(targets), 1)) as pool:
    errors = dict(zip(targets, pool.map(attempt, targets), strict=True))
print(json.dumps({"open": sorted(t for t, e in errors.items() if e is None),
                  "closed": {t: e for t, e in errors.items() if e is not None}}))
