# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The plan: a pure function from the node group and the job spec to ranks and rendezvous."""

from __future__ import annotations

DOCUMENTATION = r"""
name: plan
author: torchherd developers
version_added: 0.1.0
short_description: Compute a torchrun launch plan from the node group and a job
description:
  - Turns the node group of the inventory into node_rank (inventory order), nnodes,
    nproc_per_node, world size, master address and port.
  - Applies the job defaults of the role argument spec C(torchherd.cluster.plan), so the
    playbooks and the driver share one definition of the job.
  - Fails with one message listing every problem (empty group, host listed twice, two hosts with
    one address, port out of range, bad nproc_per_node, unknown master) before any node is touched.
positional: _input, groups, hostvars
options:
  _input:
    description: The job (C(torchherd_job)).
    type: dict
    required: true
  groups:
    description: The inventory's C(groups).
    type: dict
    required: true
  hostvars:
    description: The inventory's C(hostvars); C(torchherd_address), else C(ansible_host), else the name gives a node's address.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Compute the plan
  ansible.builtin.set_fact:
    torchherd_plan: "{{ torchherd_job | torchherd.cluster.plan(groups, hostvars) }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    job:
      description: The job with every default filled in.
      type: dict
    nodes:
      description: One entry per node in rank order, with C(host), C(address), C(node_rank).
      type: list
      elements: dict
    nnodes:
      description: Number of nodes (C(MIN:MAX) for elastic jobs).
      type: str
    nproc_per_node:
      description: Processes per node, or C(auto) until preflight resolves it.
      type: raw
    world_size:
      description: Total number of ranks, or null while nproc_per_node is C(auto).
      type: int
    master:
      description: C(host), C(addr) and C(port) of the rendezvous master.
      type: dict
"""

import os
import re

import yaml
from ansible.errors import AnsibleFilterError

SPEC_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "roles", "plan", "meta", "argument_specs.yml",
)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_NNODES = re.compile(r"^(\d+):(\d+)$")


def job_defaults(spec_path=SPEC_PATH):
    """Defaults of every job key, read from the role argument spec (the one definition)."""
    with open(spec_path, encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)
    options = spec["argument_specs"]["main"]["options"]["torchherd_job"]["options"]
    return {key: opt.get("default") for key, opt in options.items() if not opt.get("required")}


def _address(name, hostvars):
    hv = hostvars.get(name, {})
    for key in ("torchherd_address", "ansible_host"):
        value = hv.get(key)
        if value:
            return str(value)
    return str(name)


def _nproc(value):
    """Positive int or 'auto'; numeric strings (from -e key=value) are accepted."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return "auto"
        if text.isdigit() and int(text) > 0:
            return int(text)
    return None


def _port(value):
    if isinstance(value, bool):
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        return None
    return port if 1 <= port <= 65535 and str(port) == str(value).strip() else None


def plan(job, groups, hostvars):
    """Return the launch plan for ``job``; raise AnsibleFilterError listing every problem."""
    if not isinstance(job, dict):
        raise AnsibleFilterError(
            f"torchherd_job: expected a dict (the job spec), found {type(job).__name__}"
        )
    merged = dict(job_defaults())
    merged.update({k: v for k, v in job.items() if v is not None})
    problems = []

    script = str(merged.get("script") or "").strip()
    if not script:
        problems.append("job.script: expected the training script's path, found nothing; "
                        "fix: set torchherd_job.script (e.g. train.py)")

    group = merged["node_group"]
    members = list(groups.get(group) or [])
    explicit = list(merged.get("nodes") or [])
    names = explicit or members
    if not members:
        problems.append(f"node group '{group}': expected at least one host, found the group "
                        f"empty or missing from the inventory; fix: list the nodes under "
                        f"[{group}] in the inventory or set torchherd_job.node_group")
    seen = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    for name, count in seen.items():
        if count > 1:
            problems.append(f"host {name}: expected each node once, found it listed {count} "
                            f"times; fix: remove the duplicate from torchherd_job.nodes")
    if explicit and members:
        for name in seen:
            if name not in members:
                problems.append(f"host {name}: expected a member of group '{group}', found it "
                                f"missing there; fix: add it to [{group}] or drop it from "
                                f"torchherd_job.nodes")
    nodes = list(dict.fromkeys(names))

    by_address = {}
    for name in nodes:
        by_address.setdefault(_address(name, hostvars), []).append(name)
    for address, owners in by_address.items():
        if len(owners) > 1:
            problems.append(f"hosts {', '.join(owners)}: expected one address per node, found "
                            f"all of them at {address}; fix: give each node its own "
                            f"ansible_host (or torchherd_address), or remove the duplicate entry")

    port = _port(merged.get("master_port"))
    if port is None:
        problems.append(f"job.master_port: expected an integer in 1..65535, found "
                        f"{merged.get('master_port')!r}; fix: set torchherd_job.master_port "
                        f"(torchrun's default is 29500)")

    nproc = _nproc(merged.get("nproc_per_node"))
    if nproc is None:
        problems.append(f"job.nproc_per_node: expected a positive integer or 'auto', found "
                        f"{merged.get('nproc_per_node')!r}; fix: set it to the GPUs per node, "
                        f"or 'auto'")

    master = merged.get("master") or (nodes[0] if nodes else "")
    if merged.get("master") and master not in nodes:
        problems.append(f"job.master: expected one of the nodes ({', '.join(nodes)}), found "
                        f"{master!r}; fix: name a host of group '{group}' or leave it empty")

    rdzv = merged.get("rdzv")
    nnodes = str(len(nodes))
    if merged.get("nnodes"):
        match = _NNODES.match(str(merged["nnodes"]).strip())
        if rdzv != "c10d":
            problems.append(f"job.nnodes: expected it empty with rdzv 'static' (the node count "
                            f"is the inventory's), found {merged['nnodes']!r}; fix: drop it or "
                            f"set rdzv: c10d")
        elif not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
            problems.append(f"job.nnodes: expected MIN:MAX with 1 <= MIN <= MAX, found "
                            f"{merged['nnodes']!r}; fix: e.g. nnodes: '2:{len(nodes) or 3}'")
        elif int(match.group(2)) < len(nodes) or int(match.group(1)) > len(nodes):
            problems.append(f"job.nnodes: expected MIN <= {len(nodes)} nodes <= MAX, found "
                            f"{merged['nnodes']!r}; fix: widen the range or change the group")
        else:
            nnodes = f"{int(match.group(1))}:{int(match.group(2))}"

    if merged.get("launcher") == "srun":
        outside = [n for n in nodes if not hostvars.get(n, {}).get("torchherd_slurm_job_id")]
        if outside:
            problems.append(f"job.launcher: expected nodes of a SLURM job (the "
                            f"torchherd.cluster.slurm inventory) for launcher srun, found "
                            f"{', '.join(outside)} outside one; fix: use that inventory, or "
                            f"launcher ssh")

    # gloo and NCCL connect between the nodes on ports the kernel picks: mode ports without
    # ports would let the rendezvous through and block the collectives (a hang at init).
    if (merged.get("firewall", True) and merged.get("firewall_mode") == "ports"
            and not merged.get("firewall_ports") and len(nodes) > 1):
        problems.append("job.firewall_ports: expected the ports gloo and NCCL use with "
                        "firewall_mode ports, found none; fix: pin them to a range "
                        "(net.ipv4.ip_local_port_range on every node) and list it in "
                        "firewall_ports, or use firewall_mode members (see the firewall "
                        "role's README.md)")

    for key, low in (("max_restarts", 0), ("timeout", 0), ("watch_interval", 1)):
        value = merged.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"job.{key}: expected an integer >= {low}, found {value!r}")

    for key in ("run_id", "name"):
        value = merged.get(key)
        if value and not _SAFE_ID.match(str(value)):
            problems.append(f"job.{key}: expected letters, digits, '.', '_' or '-' (it names "
                            f"directories), found {value!r}")

    if problems:
        raise AnsibleFilterError("torchherd plan: the job cannot start:\n  - "
                                 + "\n  - ".join(problems))

    name = merged.get("name") or os.path.splitext(os.path.basename(script))[0] or "job"
    if not _SAFE_ID.match(name):
        name = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip("._-") or "job"
    merged["name"] = name
    merged["nproc_per_node"] = nproc
    merged["master_port"] = port
    addr = merged.get("master_addr") or _address(master, hostvars)
    return {
        "run_id": merged.get("run_id") or "",
        "job": merged,
        "nodes": [{"host": h, "address": _address(h, hostvars), "node_rank": i}
                  for i, h in enumerate(nodes)],
        "nnodes": nnodes,
        "nproc_per_node": nproc,
        "world_size": None if nproc == "auto" else nproc * len(nodes),
        "master": {"host": master, "addr": addr, "port": port},
    }


class FilterModule:
    """torchherd planning filters."""

    def filters(self):
        return {"plan": plan}
