"""Print the "torchherd-allreduce ok" lines (examples/allreduce.py) of node logs as JSON rows.

    python3 allreduce_lines.py NODE=LOG...

One row per line found: {"log": NODE, "host", "node_rank", "local_rank", "rank", "sum", "expected"}.
A LOG that does not exist is an error.
"""

import json
import re
import sys

LINE = re.compile(r"torchherd-allreduce ok host=(\S+) node_rank=(\d+) local_rank=(\d+) "
                  r"rank=(\d+) sum=(\S+) expected=(\S+)")

rows = []
for arg in sys.argv[1:]:
    node, path = arg.split("=", 1)
    with open(path, errors="replace") as log:
        for m in LINE.finditer(log.read()):
            rows.append({"log": node, "host": m[1], "node_rank": int(m[2]), "local_rank": int(m[3]),
                         "rank": int(m[4]), "sum": float(m[5]), "expected": float(m[6])})
print(json.dumps(rows))
