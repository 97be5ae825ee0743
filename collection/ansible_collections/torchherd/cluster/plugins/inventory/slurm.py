# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The nodes of a running SLURM job as the node group, in SLURM's order."""

from __future__ import annotations

DOCUMENTATION = r"""
name: slurm
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: The nodes of a running SLURM job, in allocation order
description:
  - Puts the nodes allocated to one running SLURM job into the node group (C(torchherd_nodes)
    unless O(group) says otherwise), in SLURM's order, the order of C(SLURM_NODEID) and of
    C(scontrol show hostnames); the first node is node_rank 0 and the master.
  - The job is O(job_id), or the job this runs in (C(SLURM_JOB_ID), set inside C(sbatch),
    C(salloc) and C(srun)). Anything else is an error that says so, as is a job that is not
    running (pending, completed, cancelled).
  - Every address comes from SLURM (the node's C(NodeAddr) in C(scontrol show node)), never
    from a guess, and becomes C(ansible_host).
  - Host variables C(torchherd_slurm_job_id) (the job id, which makes the torchrun role start
    the job as a SLURM job step through C(srun)), C(torchherd_slurm_node) (SLURM's node name)
    and C(torchherd_slurm_gpus) (GPUs the job holds on the node, from the job's per-node GRES
    detail, else its GPUs per node, else its total GPUs spread evenly, else 0).
  - Runs C(scontrol) (argv lists, no shell) three times or so, on the machine that runs
    Ansible, which must be a SLURM client of the job's cluster.
  - The file must be named C(*slurm.yml) or C(*slurm.yaml).
extends_documentation_fragment:
  - constructed
options:
  plugin:
    description: Marks the file as a configuration of this plugin.
    type: str
    required: true
    choices: [torchherd.cluster.slurm]
  job_id:
    description:
      - The SLURM job whose nodes to list. Unset, the job this runs in (C(SLURM_JOB_ID)).
    type: str
    env:
      - name: SLURM_JOB_ID
  group:
    description: The inventory group that receives the job's nodes (the job's C(node_group)).
    type: str
    default: torchherd_nodes
  scontrol:
    description: The C(scontrol) command, a name on C(PATH) or a path.
    type: str
    default: scontrol
  timeout:
    description: Seconds each C(scontrol) call may take.
    type: int
    default: 30
"""

EXAMPLES = r"""
# torchherd.slurm.yml: inside an allocation (sbatch, salloc), its nodes; then, in the batch script,
#   ansible-playbook torchherd.cluster.launch -i torchherd.slurm.yml -e @job.yml
plugin: torchherd.cluster.slurm

# A given job, e.g. from a login node, with the nodes reached over another network, and a
# group per GPU count:
# plugin: torchherd.cluster.slurm
# job_id: "123456"
# compose:
#   torchherd_address: torchherd_slurm_node ~ '-ib'
# keyed_groups:
#   - key: torchherd_slurm_gpus | string
#     prefix: gpus
"""

import re
import subprocess

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable

# A `Key=` at the start or after white space; a value runs to the next one.
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=")
# Keys of one group of `scontrol -d show job` details: the GRES one node group holds.
_DETAIL_KEYS = {"CPU_IDs", "Mem", "GRES"}
_NOT_SET = ("", "(null)", "N/A", "None")
# Inside the parentheses of a GRES: gpu(CNT:2), gpu:2(IDX:0,2), gpu:2(S:0-1,IDX:0-1).
_CNT = re.compile(r"CNT:(\d+)")
_IDX = re.compile(r"IDX:([\d,-]+)")


class SlurmError(Exception):
    """A SLURM job that cannot be the inventory, with the message to show."""


def parse_record(line):
    """One `scontrol -o` record as a list of (key, value) pairs, in order; keys may repeat."""
    found = list(_KEY.finditer(line))
    pairs = []
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(line)
        pairs.append((match.group(1), line[match.end():end].strip()))
    return pairs


def _split_top(text):
    """Split on commas outside parentheses: gpu:2(IDX:0,2),nic:1 -> two items."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def _idx_count(spec):
    count = 0
    for part in spec.split(","):
        low, _sep, high = part.partition("-")
        if low.isdigit():
            count += int(high) - int(low) + 1 if high.isdigit() else 1
    return count


def gpus_in_gres(text):
    """GPUs in a GRES or TRES-per-node string, whatever SLURM's version writes:
    gpu:2(IDX:0-1), gpu:a100:2, gpu(CNT:2), gres:gpu:2, gres/gpu:a100:2, gres/gpu=2."""
    if text is None or text.strip() in _NOT_SET:
        return 0
    total = 0
    for item in _split_top(text):
        for prefix in ("gres/", "gres:"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        head, _sep, paren = item.partition("(")
        head, _eq, value = head.partition("=")
        parts = head.split(":")
        if parts[0] != "gpu":
            continue
        if value.strip().isdigit():
            total += int(value)
            continue
        if len(parts) > 1 and parts[-1].isdigit():
            total += int(parts[-1])
            continue
        cnt, idx = _CNT.search(paren), _IDX.search(paren)
        total += int(cnt.group(1)) if cnt else _idx_count(idx.group(1)) if idx else 1
    return total


def gpus_in_tres(text):
    """GPUs in a TRES string (cpu=4,node=2,gres/gpu=8): the untyped gres/gpu count."""
    if not text:
        return 0
    for item in text.split(","):
        key, _sep, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return 0


def job_fields(pairs):
    """The first value of each key: JobState, NodeList, TresPerNode, ..."""
    fields = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    return fields


def detail_groups(pairs):
    """The per-node detail groups of `scontrol -d show job`: [(nodes expression, GRES)]."""
    groups = []
    current = None
    for key, value in pairs:
        if key == "Nodes":
            current = [value, ""]
            groups.append(current)
        elif current is not None and key in _DETAIL_KEYS:
            if key == "GRES":
                current[1] = value
        else:
            current = None
    return [tuple(group) for group in groups]


def node_addresses(text):
    """NodeName -> NodeAddr from `scontrol -o show node` output."""
    found = {}
    for line in text.splitlines():
        fields = job_fields(parse_record(line))
        if fields.get("NodeName"):
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return found


def gpus_per_node(fields, groups, hosts, expand):
    """GPUs the job holds on each of its hosts: per-node details first, then GPUs per node,
    then the job's total spread evenly, else 0. expand(expr) lists a hostlist's names."""
    gpus = dict.fromkeys(hosts, 0)
    detailed = [(nodes, gres) for nodes, gres in groups if gres not in _NOT_SET]
    if detailed:
        for nodes, gres in detailed:
            count = gpus_in_gres(gres)
            for host in expand(nodes):
                if host in gpus:
                    gpus[host] = count
        return gpus
    per_node = gpus_in_gres(fields.get("TresPerNode"))
    if per_node:
        return dict.fromkeys(hosts, per_node)
    total = (gpus_in_gres(fields.get("JOB_GRES")) or gpus_in_tres(fields.get("AllocTRES"))
             or gpus_in_tres(fields.get("TRES")))
    if total and hosts and total % len(hosts) == 0:
        return dict.fromkeys(hosts, total // len(hosts))
    return gpus


def allocation(job_id, scontrol):
    """The job's nodes in SLURM's order: [{name, address, gpus}].

    scontrol(argv) runs scontrol with these arguments and returns its stdout, or raises
    SlurmError with its message."""
    if not job_id:
        raise SlurmError(
            "no SLURM job: expected to run inside an allocation (SLURM_JOB_ID set by sbatch, "
            "salloc or srun) or a job_id in the inventory file, found neither; fix: run this "
            "from the batch script (sbatch) or inside salloc, or set job_id: <id>")
    text = scontrol(["--details", "--oneliner", "show", "job", str(job_id)])
    records = [parse_record(line) for line in text.splitlines() if line.strip()]
    records = [r for r in records if job_fields(r).get("JobId") == str(job_id)] or records
    if len(records) != 1:
        raise SlurmError(
            f"SLURM job {job_id}: expected one job, found {len(records)} records (a job array "
            f"or heterogeneous job); fix: give the job id of one array task or component")
    fields = job_fields(records[0])
    state = fields.get("JobState", "")
    if state != "RUNNING":
        raise SlurmError(
            f"SLURM job {job_id}: expected a RUNNING job, found it {state or 'in no state'}"
            f" ({fields.get('Reason', '')}); fix: launch inside the job once it runs (its "
            f"batch script or salloc), or name a running job")
    nodelist = fields.get("NodeList", "")
    if nodelist in _NOT_SET:
        raise SlurmError(f"SLURM job {job_id}: expected allocated nodes, found none")

    expanded = {}

    def expand(expression):
        if expression not in expanded:
            expanded[expression] = scontrol(["show", "hostnames", expression]).split()
        return expanded[expression]

    hosts = expand(nodelist)
    addresses = node_addresses(scontrol(["--oneliner", "show", "node", nodelist]))
    missing = [h for h in hosts if h not in addresses]
    if missing:
        raise SlurmError(f"SLURM job {job_id}: expected scontrol show node to know "
                         f"{', '.join(missing)}, found no record of them")
    gpus = gpus_per_node(fields, detail_groups(records[0]), hosts, expand)
    return [{"name": h, "address": addresses[h], "gpus": gpus[h]} for h in hosts]


class InventoryModule(BaseInventoryPlugin, Constructable):
    NAME = "torchherd.cluster.slurm"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("slurm.yml", "slurm.yaml"))

    def _scontrol(self, args):
        argv = [self.get_option("scontrol"), *args]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, check=False,
                                    timeout=self.get_option("timeout"))
        except FileNotFoundError as exc:
            raise SlurmError(f"{argv[0]}: expected SLURM's client commands on this machine, "
                             f"found no {argv[0]}; fix: run Ansible on a node or login node "
                             f"of the cluster, or set scontrol: <path>") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{' '.join(argv)}: no answer within {exc.timeout} s; is "
                             f"slurmctld up?") from exc
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip() or f"exit code {result.returncode}"
            raise SlurmError(f"{' '.join(argv)} failed: {detail}")
        return result.stdout

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        job_id = str(self.get_option("job_id") or "").strip()
        try:
            nodes = allocation(job_id, self._scontrol)
        except SlurmError as exc:
            raise AnsibleParserError(f"torchherd.cluster.slurm: {exc}") from exc

        group = self.inventory.add_group(self.get_option("group"))
        strict = self.get_option("strict")
        for node in nodes:
            name = node["name"]
            self.inventory.add_host(name, group=group)
            for key, value in (("ansible_host", node["address"]),
                               ("torchherd_slurm_job_id", job_id),
                               ("torchherd_slurm_node", name),
                               ("torchherd_slurm_gpus", node["gpus"])):
                self.inventory.set_variable(name, key, value)
            hostvars = self.inventory.get_host(name).get_vars()
            self._set_composite_vars(self.get_option("compose"), hostvars, name, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), hostvars, name,
                                              strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), hostvars, name,
                                           strict=strict)
