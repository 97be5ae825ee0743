# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Which nodes answered: node_facts ran on them, or why not (SSH, its host key, the facts)."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import problem


def _ssh_error(msg):
    """Ansible wraps ssh's own words ("ssh: connect to host ...: Connection refused")."""
    text = " ".join(str(msg or "unreachable").split())
    marker = text.rfind("ssh: ")
    if marker > 0:
        text = text[marker:]
    return text.removeprefix("Task failed: ")[:300]


def answered(hosts, hostvars):
    """({host: its facts} of the nodes whose node_facts ran, problems of the others)."""
    facts, problems = {}, []
    for host in hosts:
        result = hostvars.get(host, {}).get("torchherd_facts") or {}
        if result.get("unreachable") and "Host key verification failed" in str(result.get("msg")):
            address = hostvars.get(host, {}).get("ansible_host") or host
            problems.append(problem(
                host, "ssh host key", "the node's host key in known_hosts",
                "an unknown or changed host key (" + _ssh_error(result.get("msg")) + ")",
                "compare the key's fingerprint with the node's owner, then add it (ssh-keyscan "
                + address + " >> ~/.ssh/known_hosts) or fix the entry (ssh-keygen -R " + address
                + "); host_key_checking = False in your ansible.cfg turns checking off"))
        elif result.get("unreachable"):
            # The inventory the host came from (Ansible's inventory_file), as the user gave it.
            source = hostvars.get(host, {}).get("inventory_file") or "<inventory>"
            problems.append(problem(host, "ssh", "the node answers over SSH",
                                    _ssh_error(result.get("msg")),
                                    "check the address, the SSH key and that sshd runs on it "
                                    "(ansible -m ping -i " + source + " " + host + ")"))
        elif result.get("failed") or "torch" not in result:
            problems.append(problem(host, "facts", "node_facts to run",
                                    (result.get("msg") or "no facts").strip()[:300],
                                    "make sure the node has Python 3 for Ansible "
                                    "(ansible_python_interpreter)"))
        else:
            facts[host] = result
    return facts, problems
