# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The plan filter's steps, one concern a module: the job, the inventory's hosts, the node
table, the runtime on the nodes, the firewall, and the choice of nodes after preflight."""
