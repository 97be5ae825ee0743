# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Which nodes answered: node_facts ran on them, or why not (SSH, its host key, its Python for
Ansible, the facts)."""

from __future__ import annotations

import re

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import problem

# Ansible's words where the module's interpreter never ran the module: missing ("The module
# interpreter '/x' was not found."), or it printed no JSON (it crashed at its start, or is not
# a Python that runs Ansible's modules).
_NOT_FOUND = re.compile(r"module interpreter '([^']+)' was not found", re.IGNORECASE)
_NO_JSON = "deserialization failed"


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
        # Where ssh ended before the module was sent, node_facts' action asked again with
        # nothing to send: its message is ssh's own reason (plugins/action/node_facts.py).
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
        elif result.get("failed") and (broken := _interpreter(host, result, hostvars)):
            problems.append(broken)
        elif result.get("failed") or "torch" not in result:
            problems.append(problem(host, "facts", "node_facts to run",
                                    (result.get("msg") or "no facts").strip()[:300],
                                    "make sure the node has Python 3 for Ansible "
                                    "(ansible_python_interpreter)"))
        else:
            facts[host] = result
    return facts, problems


def _interpreter(host, result, hostvars):
    """The problem of a node whose Python for Ansible's modules is missing or broken (None
    where the module ran and failed on its own): the interpreter used (the inventory's
    ansible_python_interpreter, else the one Ansible discovered) and what it said."""
    msg = " ".join(str(result.get("msg") or "").split())
    said = [line.strip() for line in str(result.get("module_stderr") or result.get("module_stdout")
                                         or "").splitlines() if line.strip()]
    missing = _NOT_FOUND.search(msg)
    # A traceback is the module's own failure: its Python ran it.
    crashed = _NO_JSON in msg and not any("Traceback" in line for line in said)
    if not (missing or crashed or result.get("rc") == 127):
        return None
    hv = hostvars.get(host, {})
    used = (missing.group(1) if missing else None) or hv.get("ansible_python_interpreter") \
        or hv.get("discovered_interpreter_python") \
        or (hv.get("ansible_facts") or {}).get("discovered_interpreter_python") \
        or "the python Ansible discovered"
    source = hv.get("inventory_file") or "<inventory>"
    return problem(host, "ansible python", f"a Python 3 at {used} that runs Ansible's modules",
                   f"{used}: {(said[-1] if said else msg)[:300]}",
                   f"set ansible_python_interpreter for {host} in {source} to a Python 3 that "
                   "is on the node (ansible_python_interpreter=/usr/bin/python3), or install "
                   "python3 there")
