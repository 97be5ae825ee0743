# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node's back port in the master-port probe (see _probe): where the master, and in the
barrier every peer after it, connects to the node at the address it came from, as the job's
gloo and NCCL peers will."""

from __future__ import annotations

import socket
import threading
import time

# The word before the back port's number on a node's connection to the master.
BACK = "back"
# The last word of a node's "back" line where it will not start (its facts changed since the
# launch that the start's arguments were computed for): the master then calls the start off.
REFUSE = "refuse"


class BackPort(threading.Thread):
    """A node's port for the master's connection back, at the address it connected from, and
    in the barrier for every peer's after it (the master's comes first: the master names the
    peers only once it connected back to every node)."""

    def __init__(self, address, token, seconds):
        super().__init__(daemon=True)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.bind((address, 0))
            # Every peer connects at once: a short backlog would drop their SYNs, and each
            # dropped one costs a second before the kernel sends it again.
            self.sock.listen(socket.SOMAXCONN)
        except OSError:
            self.sock.close()
            raise
        self.address, self.port = address, self.sock.getsockname()[1]
        self.token, self.deadline = token.encode() + b"\n", time.monotonic() + seconds
        self.reached = threading.Event()

    def run(self):
        try:
            while True:
                self.sock.settimeout(max(0.05, self.deadline - time.monotonic()))
                conn = self.sock.accept()[0]
                try:
                    conn.sendall(self.token)
                except OSError:
                    pass
                finally:
                    conn.close()
                self.reached.set()
        except OSError:
            pass  # closed (close()) or its time is up
        finally:
            self.sock.close()

    def close(self):
        """Stop listening (the accept above ends): no port of the probe outlives it."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def offer_back(sock, token, seconds, name=None, refuse=False):
    """Listen at the connection's local address and tell the master the port (and this node's
    name, for the pairs' messages); None where the node cannot listen there (it says so, and
    the master checks nothing back). With `refuse`, the line also says that this node will not
    start (REFUSE)."""
    try:
        back = BackPort(sock.getsockname()[0], token, seconds)
    except OSError:
        back = None
    else:
        back.start()
    named = f" {name}" if name and not any(c.isspace() for c in name) else ""
    if refuse:
        named = f"{named or ' -'} {REFUSE}"
    try:
        sock.sendall(f"{BACK} {back.port if back else '-'}{named}\n".encode())
    except OSError:
        return None
    return back


def back_error(back, address, seconds, close=True):
    """Why the master did not reach this node back, or None. With `close`, the back port
    closes (else the peers still connect to it)."""
    if back is None:
        return None
    reached = back.reached.wait(seconds)
    if close:
        back.close()
        back.join(1)
    if reached:
        return None
    return (f"the master could not open a connection to this node at {address} (as the job's "
            f"peers must: gloo and NCCL listen on every node, on ports the kernel picks): a "
            f"firewall on this node dropping them, or no way back to {address}")
