# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The preflight gate: compare the facts of every node and decide whether the job may start."""

from __future__ import annotations

import posixpath
import re

from ansible_collections.torchherd.cluster.plugins.module_utils._hostfacts import nearest
from ansible_collections.torchherd.cluster.plugins.module_utils._interconnect import judge
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS

DOCUMENTATION = r"""
name: gate
author: torchherd developers
version_added: 0.1.0
short_description: Compare the nodes' preflight facts and list every reason the job cannot start
description:
  - Takes the facts C(torchherd.cluster.node_facts) gathered on each node and the plan.
  - Checks that every node answered, that the job interpreter runs and imports torch, that
    versions match across nodes, that rsync is there, that the master port is free on the master,
    that nccl jobs have GPUs and NCCL, that no two nodes share GPUs, that no other run with this
    run id is alive, and resolves O(plan.nproc_per_node=auto).
  - For nccl jobs, checks the GPUs each node's processes will use (free of other processes, an
    architecture the torch build has kernels for, a driver new enough for its CUDA, a compute
    mode that lets the job in), that NCCL tells the nodes apart, and the InfiniBand/RoCE ports;
    and warns of what slows or endangers a job without stopping it (see RV(warnings)). The
    checks are listed in the docs' preflight section.
  - Each problem names the host, the check, what was expected, what was found and the fix.
positional: _input, hostvars, plan
options:
  _input:
    description: The hosts of the run, in rank order.
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars); each host's registered C(torchherd_facts) is read.
    type: dict
    required: true
  plan:
    description: The plan from C(torchherd.cluster.plan).
    type: dict
    required: true
  match:
    description:
      - Fact keys that must be equal on every node; the version of the job's launcher (other
        than torchrun) is compared as well.
      - C(python.minor) is the major and minor version of the job's Python (3.11); a patch
        release (3.11.2 against 3.11.9) does not break a job, another minor version does
        (pickled objects, compiled extensions).
    type: list
    elements: str
    default: [python.minor, torch.version, torch.cuda, torch.nccl]
"""

EXAMPLES = r"""
- name: Compare the nodes
  ansible.builtin.set_fact:
    torchherd_gate: "{{ ansible_play_hosts_all | torchherd.cluster.gate(hostvars, torchherd_plan) }}"
  run_once: true
"""

RETURN = r"""
_value:
  description: The verdict.
  type: dict
  contains:
    ok:
      description: Whether the job may start.
      type: bool
    problems:
      description: One dict per problem with C(host), C(check), C(expected), C(found), C(fix).
      type: list
      elements: dict
    warnings:
      description:
        - What makes a job slow or fragile but lets it start, in the same form as RV(problems)
          (persistence mode off, a small C(/dev/shm), ECC or Xid history, ...), and the
          problems whose check the job's C(preflight_warn) names.
      type: list
      elements: dict
    nproc_per_node:
      description: Processes per node with C(auto) resolved; null when the nodes run different
        counts (see RV(nprocs)).
      type: int
    nprocs:
      description: Host to its processes (its own C(torchherd_nproc_per_node), or the job's,
        C(auto) resolved to its GPU count, 1 without GPUs).
      type: dict
    world_size:
      description: Total number of ranks, the sum of RV(nprocs).
      type: int
    interfaces:
      description:
        - Host to the interface its job traffic uses (C(name), C(address), C(how)), from
          RV(torchherd.cluster.node_facts#module:interface); the start exports the name as
          GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME on that host and its barrier connects from
          the address.
      type: dict
    interconnect:
      description:
        - The interconnect check's verdict where it ran (null otherwise) - C(ok), C(allreduce)
          (C(busbw) and C(algbw) in GB/s, C(latency_us), C(bytes), C(world_size)), C(pairs)
          (C(a), C(b), C(gbps) each way), C(threshold_gbps) and C(threshold_why), C(slow_nodes),
          C(slow_links), every node's C(results), and C(reused) (C(run_id), C(at)) when the
          measure of an earlier run of the same nodes was reused.
        - Its problems are among RV(problems), check C(interconnect), naming the node slow with
          every peer, or the link between two.
      type: dict
    table:
      description: A per-host table of the key facts and the problems, for people.
      type: str
    node_env:
      description:
        - "Per host, what the start adds to the job's environment from the node's facts (the
          job's own env wins): for nccl jobs across nodes with InfiniBand/RoCE ports,
          C(NCCL_IB_HCA) naming exactly the ACTIVE ones (C(=mlx5_0:1,mlx5_1:1)), of those only
          the ones nearest to the job's GPUs on the PCI tree where the facts place both, unless
          the job sets it or C(NCCL_IB_DISABLE)."
      type: dict
    left_out:
      description: The plan's C(excluded) and C(left_out) (C(torchherd.cluster.choose_nodes)),
        each node the launch left out and why; empty where the job takes every node.
      type: dict
"""


def _launcher_key(name):
    """The fact key of a launcher's installed version (node_facts's torch.launchers)."""
    return f"torch.launchers.{name}"


DEFAULT_MATCH = ["python.minor", "torch.version", "torch.cuda", "torch.nccl"]
MIN_FREE_BYTES = 1 << 30

FIXES = {
    "python.minor": "use the same Python minor version everywhere: one venv built the same "
                    "way on every node, named by torchherd_job.python (or torchherd_python)",
    "torch.version": "install the same torch on every node (pip install torch==<version> in the "
                     "job's venv), or point torchherd_job.python at the venv that has it",
    "torch.cuda": "install the torch build for the same CUDA version on every node",
    "torch.nccl": "install the same torch build (it bundles NCCL) on every node",
}
FIXES.update({_launcher_key(name): launcher.FIX for name, launcher in LAUNCHERS.items()
              if launcher.FIX})


def _minor(facts):
    version = str((facts.get("python") or {}).get("version") or "")
    return ".".join(version.split(".")[:2]) or None


# Keys compared that are not facts themselves but derived from them.
DERIVED = {"python.minor": _minor}


def _get(facts, dotted):
    if dotted in DERIVED:
        return DERIVED[dotted](facts)
    value = facts
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _problem(host, check, expected, found, fix):
    return {"host": host, "check": check, "expected": str(expected), "found": str(found),
            "fix": fix}


def _ssh_error(msg):
    """Ansible wraps ssh's own words ("ssh: connect to host ...: Connection refused")."""
    text = " ".join(str(msg or "unreachable").split())
    marker = text.rfind("ssh: ")
    if marker > 0:
        text = text[marker:]
    return text.removeprefix("Task failed: ")[:300]


def _named(plan, host):
    """The interface the user named for host in the plan."""
    for node in plan.get("nodes") or []:
        if node.get("host") == host:
            return node.get("interface") or "?"
    return "?"


def _fmt_bytes(count):
    return f"{count / (1 << 30):.1f} GiB"


def gate(hosts, hostvars, plan, match=None):
    """The verdict on the nodes' facts (see RETURN): every check below, its problems listed in
    this order, and the process counts and backend resolved from the facts."""
    job, master = plan["job"], plan["master"]["host"]
    launcher = LAUNCHERS[job.get("launcher", "torchrun")]
    facts, problems = answered(hosts, hostvars)
    for host, f in facts.items():
        for check in NODE_CHECKS:
            problems += check(host, f, plan)
    usable = {h: f for h, f in facts.items() if f["torch"].get("version")}
    problems += launcher_installed(usable, launcher)
    problems += versions_match(usable, master, _match_keys(match, launcher))
    unreachable = reachable(facts, hostvars, plan)
    problems += unreachable
    interfaces, missing = chosen_interfaces(facts, plan)
    problems += missing
    if unreachable:
        problems += firewall_without_root(hosts, hostvars, plan)
    problems += master_port(facts, plan)
    gpu_counts = {h: int(f["torch"].get("gpu_count") or 0) for h, f in usable.items()}
    # The job's auto on every node: a node with fewer GPUs than the others is more often a
    # broken GPU than a plan; nodes that differ on purpose set their own counts.
    auto = plan["nproc_per_node"] == "auto" and not any(
        hostvars.get(h, {}).get("torchherd_nproc_per_node") is not None for h in hosts)
    if auto:
        problems += same_gpu_count(gpu_counts)
    nprocs = _nprocs(hosts, plan, gpu_counts, auto)
    distinct = set(nprocs.values())
    backend = _backend(job, gpu_counts)
    problems += backend_available(usable, backend, gpu_counts, nprocs)
    problems += duplicate_gpus(usable, backend)
    warnings = []
    for host, f in facts.items():
        for check in NODE_WARNINGS:
            warnings += check(host, f, nprocs[host], plan)
    if backend == "nccl":
        problems += host_identity(usable, plan)
        for host, f in usable.items():
            # The GPUs the node's processes take: local rank i uses the i-th one it sees.
            needed = (f["torch"].get("gpus") or [])[:nprocs[host]]
            for check in GPU_CHECKS:
                problems += check(host, f, needed, plan)
            for check in GPU_WARNINGS:
                warnings += check(host, f, needed, plan)
    problems, warnings = downgraded(problems, warnings, job.get("preflight_warn") or [])
    interconnect = _interconnect(hosts, hostvars, job, facts)
    if interconnect:
        problems += [_problem(*p) for p in interconnect.pop("problems")]
    rows = _rows(hosts, facts, interfaces, gpu_counts, nprocs)
    left_out = {**(plan.get("excluded") or {}), **(plan.get("left_out") or {})}
    # What the start adds to each node's environment from its facts (the job's env wins).
    node_env = {}
    if backend == "nccl":
        for host, f in usable.items():
            hca = ib_hca(f, plan, (f["torch"].get("gpus") or [])[:nprocs[host]])
            if hca:
                node_env[host] = {"NCCL_IB_HCA": hca}
    return {
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "nproc_per_node": distinct.pop() if len(distinct) == 1 else None,
        "nprocs": nprocs,
        "world_size": sum(nprocs.values()),
        "interfaces": interfaces,
        "backend": backend,
        "interconnect": interconnect,
        "left_out": left_out,
        "node_env": node_env,
        "table": render(rows, problems, interconnect, warnings, left_out),
    }


def answered(hosts, hostvars):
    """({host: its facts} of the nodes whose node_facts ran, problems of the others)."""
    facts, problems = {}, []
    for host in hosts:
        result = hostvars.get(host, {}).get("torchherd_facts") or {}
        if result.get("unreachable") and "Host key verification failed" in str(result.get("msg")):
            address = hostvars.get(host, {}).get("ansible_host") or host
            problems.append(_problem(
                host, "ssh host key", "the node's host key in known_hosts",
                "an unknown or changed host key (" + _ssh_error(result.get("msg")) + ")",
                "compare the key's fingerprint with the node's owner, then add it (ssh-keyscan "
                + address + " >> ~/.ssh/known_hosts) or fix the entry (ssh-keygen -R " + address
                + "); host_key_checking = False in your ansible.cfg turns checking off"))
        elif result.get("unreachable"):
            problems.append(_problem(host, "ssh", "the node answers over SSH",
                                     _ssh_error(result.get("msg")),
                                     "check the address, the SSH key and that sshd runs on it "
                                     "(ansible -m ping -i <inventory> " + host + ")"))
        elif result.get("failed") or "torch" not in result:
            problems.append(_problem(host, "facts", "node_facts to run",
                                     (result.get("msg") or "no facts").strip()[:300],
                                     "make sure the node has Python 3 for Ansible "
                                     "(ansible_python_interpreter)"))
        else:
            facts[host] = result
    return facts, problems


def venv(host, f, plan):
    """The job's locked venv was made (or found) on the node."""
    made = f.get("venv") or {}
    if not made.get("error"):
        return []
    lock = (plan["job"].get("venv") or {}).get("lock")
    return [_problem(host, "venv", f"a venv from {lock} made with uv at {made.get('path')}",
                     made["error"].strip()[-600:],
                     "check that the node reaches the job's venv.index_url or venv.find_links "
                     "and that every pinned version is there for its Python and platform; uv "
                     "comes from PATH, ~/.local/bin or a pip install (or set venv.uv)")]


def container(host, f, plan):
    """The job's image is on the node (or was pulled) and its runtime answers the SSH user."""
    found = f.get("container") or {}
    if not found.get("error"):
        return []
    spec = plan.get("container") or {}
    image = spec.get("image") or found.get("image")
    error = found["error"]
    if not found.get("path"):
        fix = ("install podman, docker or apptainer on the node (or name the one there: "
               "container.runtime), or leave the node out of the inventory")
    elif "sandbox directory" in error:  # apptainer's image: a path that is not there
        fix = (f"copy the SIF file to {image} on the node (or to a shared file system), or give "
               "the image as a docker://, oras:// or library:// URI that the node pulls")
    elif "pull policy is never" in error and found.get("runtime") in ("apptainer", "singularity"):
        fix = "set container.pull to missing (the node pulls it once into its torchherd root)"
    elif "pull policy is never" in error:
        fix = (f"load the image on the node ({found.get('runtime')} pull {image}, or "
               f"{found.get('runtime')} load), or set container.pull to missing")
    elif "pull" in error:
        fix = ("check the image's name and that the node reaches its registry (and is logged "
               f"in: {found.get('runtime')} login as the SSH user), or load it there by hand")
    else:
        fix = ("let the SSH user run the runtime without a prompt (docker: the docker group; "
               "podman: rootless, or root), then try again")
    return [_problem(host, "container",
                     f"image {image} runnable with {found.get('runtime') or spec.get('runtime')}",
                     error, fix)]


def interpreter(host, f, plan):
    """The job's interpreter runs and imports torch."""
    py, torch = f["python"], f["torch"]
    if (f.get("venv") or {}).get("error") or (f.get("container") or {}).get("error"):
        return []  # the venv's (the image's) problem says why its interpreter is not there
    if "took more than" in (torch.get("error") or ""):
        # The probe ran out of time: the interpreter is there, it says nothing of its version.
        return [_problem(host, "torch", f"torch importable by {py.get('path')} "
                         "within the facts' probe timeout", torch["error"],
                         "the node was too busy or its file system too slow: try "
                         "again, or launch with fewer forks (fewer nodes import "
                         "torch at once where they share a machine or a file "
                         "system); the answer is cached once it came")]
    image = f.get("container") or {}
    where = f" in image {image.get('image')}" if image else ""
    if py.get("error") or not py.get("version"):
        fix = (f"check that {image.get('runtime')} runs the image on this node "
               f"({image.get('runtime')} run --rm {image.get('image')} {py.get('path')} -V), "
               "or set container.python to the image's interpreter" if image else
               "set torchherd_job.python to an interpreter that exists on every node")
        return [_problem(host, "python", f"{py.get('path')}{where} runs",
                         py.get("error") or "no version", fix)]
    if torch.get("error") or not torch.get("version"):
        fix = ("use an image with torch, or set container.python to the image's interpreter "
               "that has it" if image else
               f"install torch for {py.get('path')} (pip install torch), "
               f"or set torchherd_job.python to the venv that has it")
        return [_problem(host, "torch", f"torch importable by {py.get('path')}{where}",
                         torch.get("error"), fix)]
    return []


def rsync(host, f, plan):
    if f.get("rsync"):
        return []
    return [_problem(host, "rsync", "rsync on the node", "not found",
                     "install rsync on the node (apt-get install rsync)")]


def py_spy(host, f, plan):
    """The hang watch reads the ranks' stacks with py-spy."""
    hang_timeout = plan["job"].get("hang_timeout")
    if not hang_timeout or f.get("py_spy"):
        return []
    py = f["python"].get("path")
    return [_problem(
        host, "py-spy", f"py-spy next to {py} or on PATH, to read every "
        f"rank's stack once the job hangs (hang_timeout {hang_timeout} s)",
        "not found", f"{py} -m pip install py-spy on the node (a static "
        "binary, no build), or leave hang_timeout at 0")]


def disk(host, f, plan):
    if f.get("disk_free_bytes", MIN_FREE_BYTES) >= MIN_FREE_BYTES:
        return []
    return [_problem(host, "disk", f">= {_fmt_bytes(MIN_FREE_BYTES)} free at {f.get('root')}",
                     _fmt_bytes(f["disk_free_bytes"]),
                     "free space (the venvs of old locks under " + str(f.get("root"))
                     + "/venvs are not removed by torchherd: remove those no job uses) or "
                     "point torchherd_root elsewhere")]


def run_id_free(host, f, plan):
    """No run of this run id is alive under the node's root. (Not under another root: nodes of
    one machine - the local inventory - each have theirs, and see each other's processes; the
    launcher started ahead on one (the schedule's start.warm) is no run on the others.)"""
    own = posixpath.normpath(posixpath.join(str(f.get("root") or ""), "runs", plan["run_id"]))
    return [_problem(host, "run id", f"run {plan['run_id']} not running",
                     f"running as pids {pids}",
                     "a run id starts once: stop it (playbooks/stop.yml) "
                     "or launch with another run id")
            for run_dir, pids in (f.get("running_jobs") or {}).items()
            if posixpath.normpath(run_dir) == own]


# The checks of one node's own facts, in the order their problems are listed.
NODE_CHECKS = (venv, container, interpreter, rsync, py_spy, disk, run_id_free)


def launcher_installed(usable, launcher):
    """The job's launcher is installed for the job's interpreter (torchrun comes with torch)."""
    if not launcher.DISTRIBUTION:
        return []
    name = launcher.NAME
    problems = []
    for host, f in usable.items():
        if not (f["torch"].get("launchers") or {}).get(name):
            py = f["python"].get("path")
            problems.append(_problem(host, name, f"{name} installed for {py} (launcher {name})",
                                     "not installed",
                                     f"pip install {launcher.DISTRIBUTION} with {py} (the job's "
                                     f"Python), or set torchherd_job.python to the venv that "
                                     f"has it"))
    return problems


def _match_keys(match, launcher):
    """The keys compared across nodes: the given ones, and the job's launcher's version."""
    keys = DEFAULT_MATCH if match is None else list(match)
    return keys + [_launcher_key(launcher.NAME)] if launcher.DISTRIBUTION else keys


def versions_match(usable, master, keys):
    """Every key equal on every node to the master's (the first usable node's without it)."""
    reference_host = master if master in usable else next(iter(usable), None)
    if not reference_host:
        return []
    ref = usable[reference_host]
    problems = []
    for key in keys:
        for host, f in usable.items():
            if key.startswith("torch.launchers.") and None in (_get(f, key), _get(ref, key)):
                continue  # a missing launcher is its own problem (launcher_installed)
            if host != reference_host and _get(f, key) != _get(ref, key):
                problems.append(_problem(host, f"same {key}",
                                         f"{_get(ref, key)} (as on {reference_host})",
                                         _get(f, key), FIXES.get(key, "make the nodes equal")))
    return problems


def _probe(hostvars, host):
    """The probe alone (verify), or the start barrier's own probe (launch)."""
    return (hostvars.get(host, {}).get("torchherd_probe")
            or (hostvars.get(host, {}).get("torchherd_start") or {}).get("probe") or {})


def reachable(facts, hostvars, plan):
    """Every node reaches the master's port, and the master reaches every node back."""
    master = plan["master"]["host"]
    addr, port = plan["master"]["addr"], plan["master"]["port"]
    problems = []
    for host in facts:
        probe = _probe(hostvars, host)
        iface = (facts[host].get("interface") or {})
        if probe.get("reachable") and probe.get("back_error"):
            address = probe.get("address") or "?"
            seen = (_probe(hostvars, master).get("back_failed") or {}).get(address)
            on = f" (its interface {iface['name']})" if iface.get("name") else ""
            problems.append(_problem(
                f"{master} -> {host}", "reachable from the master",
                f"a TCP connection from {master} to {host} at {address}{on}, as the job's "
                f"peers open them (gloo and NCCL listen on every node)",
                f"{seen} ({probe['back_error']})" if seen else probe["back_error"],
                f"let the job's other nodes into {host} on any TCP port (the firewall role does "
                f"it for the run where it may, firewall: true; mode ports needs the ports gloo "
                f"and NCCL are pinned to), or name an interface of {host} that the others reach "
                f"(torchherd_socket_ifname)"))
            continue
        if probe.get("skipped") or not probe or probe.get("reachable"):
            continue
        via = f" from its interface {iface['name']} ({iface['address']})" \
            if iface.get("name") and iface.get("address") else ""
        problems.append(_problem(
            f"{host} -> {master}", "master reachable",
            f"a TCP connection from {host}{via} to {addr}:{port}",
            probe.get("error") or probe.get("msg") or "no answer",
            f"open port {port} on {master} to {host} (the job's firewall role does it, or "
            f"e.g. nft add rule inet filter input ip saddr <{host}'s address> tcp dport {port} "
            f"accept), check the route between them both ways, or set master_addr / the "
            f"master's torchherd_address to an address every node reaches"
            + (f"; the job's traffic leaves {host} on {iface['name']} "
               f"({'named by you' if iface.get('how') == 'explicit' else 'its route to ' + addr}):"
               f" name one that reaches the master with torchherd_socket_ifname or "
               f"socket_ifname" if via else "")))
    # The barrier's all-pairs proof, on the master: every pair of nodes that could not connect
    # on the job's interfaces, each already a problem of this template (module_utils/_probe).
    problems += list(_probe(hostvars, master).get("pairs_failed") or [])
    return problems


def chosen_interfaces(facts, plan):
    """({host: the interface its job traffic uses}, problems of the nodes without one)."""
    addr = plan["master"]["addr"]
    interfaces, problems = {}, []
    for host, f in facts.items():
        iface = f.get("interface") or {}
        if iface.get("error"):
            named = iface.get("how") == "explicit"
            problems.append(_problem(
                host, "interface",
                f"interface {iface.get('name') or _named(plan, host)} with an address to reach "
                f"{addr} from" if named else f"an interface whose route reaches {addr}",
                iface["error"],
                "name an interface of this node that reaches the master (torchherd_socket_ifname "
                "for the node, socket_ifname for the job; ip -br addr lists them)" if named else
                f"give the node a route to {addr} (the master address), or set master_addr / "
                f"the master's torchherd_address to an address every node reaches"))
        elif iface.get("name"):
            interfaces[host] = {k: iface.get(k) for k in ("name", "address", "how")}
    return interfaces, problems


def firewall_without_root(hosts, hostvars, plan):
    """Where a path did not open and the user could not change a node's firewall (no root, no
    sudo), the rules that node lacks, for whoever may add them."""
    problems = []
    for host in hosts:
        firewall = hostvars.get(host, {}).get("torchherd_firewall") or {}
        if not (isinstance(firewall, dict) and firewall.get("no_privilege")):
            continue
        node = next((n for n in plan.get("nodes") or [] if n.get("host") == host), {})
        rules = node.get("firewall") or {}
        peers = " ".join(rules.get("peers") or []) or "-"
        ports = "any TCP port" if rules.get("mode") != "ports" else \
            "TCP ports " + ", ".join(rules.get("ports") or [])
        dport = "" if rules.get("mode") != "ports" else \
            " tcp dport { " + ", ".join(rules.get("ports") or []) + " }"
        problems.append(_problem(
            host, "firewall (no root)",
            f"the job's rules opened there: {ports} from {peers}",
            f"the user may not change the firewall ({firewall.get('msg') or 'no root'})",
            f"ask an administrator to let the job's nodes in (e.g. nft insert rule inet filter "
            f"input ip saddr {{ {peers.replace(' ', ', ')} }}{dport} accept), give the user "
            f"passwordless sudo there (become), or launch as a user who may"))
    return problems


def master_port(facts, plan):
    master = plan["master"]["host"]
    if master not in facts or facts[master].get("port_free") is not False:
        return []
    return [_problem(master, "master port", f"port {plan['master']['port']} free on the master",
                     "in use by another process",
                     "stop what listens there (ss -ltnp sport = :PORT) or set "
                     "torchherd_job.master_port to a free port")]


def same_gpu_count(gpu_counts):
    """With the job's auto on every node, every node has the same GPU count."""
    if len(set(gpu_counts.values())) <= 1:
        return []
    return [_problem(host, "gpu count", "the same GPU count on every node "
                     "(nproc_per_node auto)", count,
                     "set nproc_per_node to a number every node has, give "
                     "nodes that differ their own torchherd_nproc_per_node, "
                     "or fix CUDA_VISIBLE_DEVICES")
            for host, count in gpu_counts.items()]


def _nprocs(hosts, plan, gpu_counts, auto):
    """{host: its processes}: its own count or the job's, auto resolved to its GPU count (1
    without GPUs); with the job's auto on every node, the smallest GPU count everywhere."""
    if auto:
        counts = set(gpu_counts.values())
        wanted = dict.fromkeys(hosts, max(min(counts) if counts else 0, 1))
    else:
        wanted = {n["host"]: n.get("nproc_per_node", plan["nproc_per_node"])
                  for n in plan.get("nodes") or []}
    nprocs = {}
    for host in hosts:
        count = wanted.get(host, plan["nproc_per_node"])
        nprocs[host] = max(gpu_counts.get(host, 0), 1) if count == "auto" else int(count or 1)
    return nprocs


def _backend(job, gpu_counts):
    """The job's backend, auto resolved: nccl where every node has a GPU, gloo otherwise."""
    backend = job.get("backend", "auto")
    if backend != "auto":
        return backend
    return "nccl" if gpu_counts and min(gpu_counts.values()) > 0 else "gloo"


def backend_available(usable, backend, gpu_counts, nprocs):
    """torch has the backend, and with nccl every process has a GPU."""
    problems = []
    for host, f in usable.items():
        t = f["torch"]
        if backend == "nccl":
            if not t.get("nccl_available"):
                problems.append(_problem(host, "nccl", "torch with NCCL",
                                         f"NCCL not available (torch {t.get('version')}, "
                                         f"CUDA {t.get('cuda')})",
                                         "install a CUDA build of torch, or use backend gloo"))
            if gpu_counts[host] < nprocs[host]:
                problems.append(_problem(host, "gpus", f">= {nprocs[host]} GPUs for "
                                         f"nproc_per_node {nprocs[host]} with nccl",
                                         f"{gpu_counts[host]} GPUs",
                                         "lower nproc_per_node to the GPU count (or auto), "
                                         "check CUDA_VISIBLE_DEVICES, or use backend gloo on CPU"))
        elif not t.get("gloo_available"):
            problems.append(_problem(host, "gloo", "torch with gloo", "gloo not available",
                                     "install a torch build with distributed support"))
    return problems


def duplicate_gpus(usable, backend):
    """Two "nodes" on one machine sharing GPUs is NCCL's "Duplicate GPU detected"."""
    if backend != "nccl":
        return []
    owners = {}
    for host, f in usable.items():
        for gpu in f["torch"].get("gpus") or []:
            uuid = gpu.get("uuid")
            key = _smi_uuid(uuid) if uuid else f"{f.get('hostname')} GPU {gpu.get('index')}"
            owners.setdefault(key, []).append(host)
    return [_problem(", ".join(sharing), "duplicate gpu", "each node its own GPUs",
                     f"{key} seen by all of them",
                     "list one inventory entry per machine, or give each entry "
                     "its own GPUs with CUDA_VISIBLE_DEVICES")
            for key, sharing in owners.items() if len(sharing) > 1]


def _smi_uuid(uuid):
    """As nvidia-smi -L shows it (torch gives the UUID without the prefix)."""
    return uuid if str(uuid).startswith("GPU-") else f"GPU-{uuid}"


def _gpu(gpu):
    return f"GPU {gpu.get('index')} ({_smi_uuid(gpu.get('uuid'))})"


def _mib(count):
    return f"{count >> 20} MiB"


def _version(text):
    """"580.65.06" -> (580, 65, 6); None where it holds no number."""
    parts = re.findall(r"\d+", str(text or ""))
    return tuple(int(p) for p in parts) or None


def _env(plan):
    return plan["job"].get("env") or {}


def _ib_used(plan, f):
    """The job spans nodes (on one, NCCL goes through shared memory and P2P, never the
    network), the node has InfiniBand/RoCE devices and the job's NCCL_IB_DISABLE leaves them on
    (a setting in /etc/nccl.conf or the node's own environment is not seen: the job's env is)."""
    return len(plan.get("nodes") or []) > 1 and bool(f.get("infiniband")) \
        and str(_env(plan).get("NCCL_IB_DISABLE", "0")).strip() in ("", "0")


PREFLIGHT_WARN_FIX = "; or, to start anyway, add '{check}' to the job's preflight_warn"

# NVIDIA's minimum Linux driver for each CUDA major version under minor version compatibility
# (CUDA Toolkit release notes, "CUDA Driver" table): any 12.x build runs on >= 525.60.13.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
MIN_SHM_BYTES = 1 << 30


def gpu_busy(host, f, needed, plan):
    """No process other than this run's holds a GPU the job's processes will use."""
    suffix = f"/runs/{plan['run_id']}"
    ours = {pid for run_dir, pids in (f.get("running_jobs") or {}).items()
            if run_dir.endswith(suffix) for pid in (pids or [])}
    holders = {}
    for proc in f.get("gpu_processes") or []:
        if proc.get("pid") not in ours:
            holders.setdefault(_smi_uuid(proc.get("gpu_uuid")), []).append(proc)
    problems = []
    for gpu in needed:
        procs = holders.get(_smi_uuid(gpu.get("uuid")))
        if not procs:
            continue
        found = ", ".join(
            f"pid {p.get('pid')} ({p.get('name') or '?'}"
            + (f", {_mib(p['used_memory_bytes'])}" if p.get("used_memory_bytes") else "") + ")"
            for p in procs)
        problems.append(_problem(
            host, "gpu busy", f"{_gpu(gpu)} free for the job", f"held by {found}",
            "stop that process (nvidia-smi lists it; a stale torchherd job: the stop playbook "
            "with its run id), or give the job other GPUs (CUDA_VISIBLE_DEVICES)"
            + PREFLIGHT_WARN_FIX.format(check="gpu busy")))
    return problems


def arch_support(cap, arch_list):
    """How a torch build with `arch_list` runs on a GPU of compute capability `cap` ("9.0"):
    "sass" (a kernel binary of its major version and a minor one not above its own, as CUDA
    loads them; sm_90a only on 9.0), "ptx" (only PTX of an architecture not above it, compiled
    by the driver at the first launch of each kernel) or None (it cannot)."""
    major, _dot, minor = str(cap).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return "sass"  # unknown: nothing to say
    gpu = (int(major), int(minor))
    how = None
    for entry in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", str(entry))
        if not match:
            continue
        kind, arch, suffix = match.group(1), (int(match.group(2)), int(match.group(3))), \
            match.group(4)
        fits = arch == gpu if suffix == "a" else arch[0] == gpu[0] and arch[1] <= gpu[1]
        if kind == "sm" and fits:
            return "sass"
        if kind == "compute" and (arch == gpu if suffix else arch <= gpu):
            how = "ptx"
    return how


def _caps(needed):
    return sorted({g["compute_cap"] for g in needed if g.get("compute_cap")})


def gpu_arch(host, f, needed, plan):
    """The torch build has kernels (or PTX) for the architecture of the job's GPUs."""
    arch_list = f["torch"].get("arch_list")
    if not arch_list:
        return []  # not read (a probe cached before it was): nothing to say
    return [_problem(
        host, "gpu arch", f"sm_{cap.replace('.', '')} (or PTX at or below it) in torch "
        f"{f['torch'].get('version')}'s arch list", " ".join(arch_list),
        "install a torch build for this GPU (a newer release, or one built for its CUDA "
        "version) in the job's venv" + PREFLIGHT_WARN_FIX.format(check="gpu arch"))
        for cap in _caps(needed) if arch_support(cap, arch_list) is None]


def cuda_driver(host, f, needed, plan):
    """The NVIDIA driver is new enough for the CUDA version torch was built with."""
    torch = f["torch"]
    cuda, driver = _version(torch.get("cuda")), _version(torch.get("driver"))
    if not needed or not cuda or not driver or cuda[0] not in MIN_DRIVER:
        return []
    minimum = MIN_DRIVER[cuda[0]]
    if driver >= _version(minimum):
        return []
    return [_problem(
        host, "cuda driver", f"NVIDIA driver >= {minimum} for torch {torch.get('version')} "
        f"(CUDA {torch.get('cuda')})", f"driver {torch.get('driver')}",
        "update the node's NVIDIA driver, or install the torch build for a CUDA version this "
        "driver supports (nvidia-smi's header names it)"
        + PREFLIGHT_WARN_FIX.format(check="cuda driver"))]


def gpu_prohibited(host, f, needed, plan):
    """No GPU of the job is in compute mode Prohibited (no process may use it)."""
    return [_problem(
        host, "gpu compute mode", f"{_gpu(gpu)} usable (compute mode Default or "
        "Exclusive_Process)", "compute mode Prohibited",
        f"nvidia-smi -i {gpu.get('index')} -c DEFAULT as root, or give the job other GPUs "
        "(CUDA_VISIBLE_DEVICES)" + PREFLIGHT_WARN_FIX.format(check="gpu compute mode"))
        for gpu in needed if str(gpu.get("compute_mode") or "").lower() == "prohibited"]


def _hca_selects(spec, device, port):
    """Whether NCCL_IB_HCA `spec` selects `port` of `device`, as NCCL reads it: entries
    name[:port], comma-separated, a prefix of the device's name unless the list starts with
    '=', every device but those with '^'."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    named = False
    for entry in filter(None, (e.strip() for e in spec.lstrip("=").split(","))):
        name, _colon, wanted = entry.partition(":")
        if (device == name if exact else device.startswith(name)) and wanted in ("", port):
            named = True
    return named != exclude


def rdma_ports(host, f, needed, plan):
    """The InfiniBand/RoCE ports NCCL will use are up: those NCCL_IB_HCA selects, else at least
    one (NCCL uses the active ones and falls back to TCP sockets, many times slower, without)."""
    if not _ib_used(plan, f):
        return []
    ports = [(device, port, (info or {}).get("state") or "?")
             for device, found in sorted(f["infiniband"].items())
             for port, info in sorted((found or {}).items())]
    listed = ", ".join(f"{d}:{p} {state}" for d, p, state in ports)
    spec = str(_env(plan).get("NCCL_IB_HCA") or "")
    fix = PREFLIGHT_WARN_FIX.format(check="rdma port")
    if spec:
        used = [p for p in ports if _hca_selects(spec, p[0], p[1])]
        down = [p for p in used if p[2] != "ACTIVE"]
        if used and not down:
            return []
        return [_problem(
            host, "rdma port", f"the ports NCCL_IB_HCA={spec} selects ACTIVE",
            ", ".join(f"{d}:{p} {state}" for d, p, state in down) if used
            else f"it selects none of {listed}",
            "bring the port up (ibstat shows it; cable, switch, subnet manager), or name only "
            "active ones in NCCL_IB_HCA" + fix)]
    if any(port[-1] == "ACTIVE" for port in ports):
        return []
    return [_problem(
        host, "rdma port", "an ACTIVE InfiniBand/RoCE port for NCCL", listed,
        "bring a port up (ibstat shows them; cable, switch, subnet manager), or set "
        "NCCL_IB_DISABLE=1 in the job's env to run NCCL over TCP" + fix)]


def ib_hca(f, plan, needed=()):
    """The NCCL_IB_HCA the start sets on a node of an nccl job that spans nodes, where the job
    leaves NCCL's InfiniBand/RoCE on and names no HCAs itself: the ports that are ACTIVE
    ("=mlx5_0:1,mlx5_1:1"), so that NCCL never picks one that is down; and where the facts place
    the job's GPUs (`needed`) and the devices on the PCI tree (gpu_nics), only the active devices
    nearest to one of those GPUs, so that a NIC no GPU of the job is near (storage, the other
    socket's) carries none of its traffic. None where there is nothing to choose (no device,
    none active) or the job chose."""
    if not _ib_used(plan, f) or _env(plan).get("NCCL_IB_HCA"):
        return None
    active = [(device, port) for device, found in sorted(f["infiniband"].items())
              for port, info in sorted((found or {}).items(), key=lambda p: (len(p[0]), p[0]))
              if (info or {}).get("state") == "ACTIVE"]
    near = set()
    devices = {device for device, _port in active}
    for gpu in needed:
        links = (f.get("gpu_nics") or {}).get(str(gpu.get("uuid") or "").removeprefix("GPU-"))
        near.update(nearest({d: how for d, how in (links or {}).items() if d in devices})[0])
    chosen = [f"{d}:{p}" for d, p in active if d in near or not near]
    return "=" + ",".join(chosen) if chosen else None


# The checks of the GPUs a node's processes use and NCCL's needs, for nccl jobs: refusals.
GPU_CHECKS = (gpu_busy, gpu_arch, cuda_driver, gpu_prohibited, rdma_ports)


def host_identity(usable, plan):
    """NCCL tells every node from the others (the hash of host name and boot id, or
    NCCL_HOSTID): nodes it takes for one try shared memory and P2P between machines."""
    hostid = _env(plan).get("NCCL_HOSTID")
    owners = {}
    for host, f in usable.items():
        if hostid:
            key = f"NCCL_HOSTID {hostid} (the job's env)"
        elif f.get("hostname") and f.get("boot_id"):
            key = f"host name {f['hostname']} and boot id {f['boot_id']}"
        else:
            continue
        owners.setdefault(key, []).append(host)
    return [_problem(
        ", ".join(sharing), "host identity", "each node its own identity to NCCL (host name "
        "and boot id, or NCCL_HOSTID)", f"{key} on all of them",
        "list one inventory entry per machine; give cloned machines their own host names; "
        "leave NCCL_HOSTID out of the job's env (or set it per node)"
        + PREFLIGHT_WARN_FIX.format(check="host identity"))
        for key, sharing in owners.items() if len(sharing) > 1]


# The refusals the job's preflight_warn may turn into warnings.
DOWNGRADABLE = ("gpu busy", "gpu arch", "cuda driver", "gpu compute mode", "rdma port",
                "host identity")


def downgraded(problems, warnings, checks):
    """(problems, warnings) with the problems of the `checks` (the job's preflight_warn) moved
    to the warnings."""
    moved = [p for p in problems if p["check"] in checks and p["check"] in DOWNGRADABLE]
    return [p for p in problems if p not in moved], warnings + moved


def shm_size(host, f, nprocs, plan):
    """/dev/shm holds NCCL's buffers between a node's processes and DataLoader workers'
    batches: a container's default (64 MB) fails them with a bus error or 'No space left'."""
    size = f.get("shm_bytes")
    if nprocs < 2 or size is None or size >= MIN_SHM_BYTES:
        return []
    return [_problem(host, "shm", f">= {_fmt_bytes(MIN_SHM_BYTES)} of /dev/shm for "
                     f"{nprocs} processes", _mib(size),
                     "give the node (container) a larger /dev/shm: podman/docker run "
                     "--shm-size=8g, or mount -o remount,size=8G /dev/shm as root")]


# The warnings of one node's own facts, every backend.
NODE_WARNINGS = (shm_size,)


def persistence(host, f, needed, plan):
    """Without persistence mode the driver sets each GPU up at every process start (1-3 s)."""
    off = [gpu for gpu in needed if gpu.get("persistence_mode") is False]
    if not off:
        return []
    return [_problem(host, "persistence mode", "persistence mode on for the job's GPUs",
                     "off on " + ", ".join(_gpu(g) for g in off),
                     "run nvidia-persistenced (systemctl enable --now nvidia-persistenced), "
                     "or nvidia-smi -pm 1 as root")]


def gpu_memory_errors(host, f, needed, plan):
    """Uncorrected ECC errors, or retired pages / remapped rows waiting for a reset: the GPU's
    memory is failing, a job on it may crash or compute wrong."""
    problems = []
    for gpu in needed:
        found = []
        if gpu.get("ecc_uncorrected"):
            found.append(f"{gpu['ecc_uncorrected']} uncorrected ECC errors since the driver "
                         "loaded")
        if gpu.get("retired_pending"):
            found.append("retired pages pending")
        if gpu.get("remapped_pending"):
            found.append("remapped rows pending")
        if found:
            problems.append(_problem(
                host, "gpu memory", f"{_gpu(gpu)} without uncorrected ECC errors or pending "
                "retirements", ", ".join(found),
                f"drain the node and reset the GPU (nvidia-smi -i {gpu.get('index')} -r as root, "
                "or reboot); if it comes back, report it to the machine's owner"))
    return problems


def xid_errors(host, f, needed, plan):
    """Xid errors since boot: the driver saw a GPU fault (fallen off the bus, double-bit ECC,
    a hung kernel)."""
    xids = f.get("xid") or []
    if not needed or not xids:
        return []
    return [_problem(host, "xid", "no Xid errors in the kernel log since boot",
                     f"{len(xids)}, the last: {xids[-1][:200]}",
                     "look the Xid up in NVIDIA's Xid catalog; most ask for a GPU reset or "
                     "reboot, some for the machine's owner")]


def gpu_sharing(host, f, needed, plan):
    """Exclusive_Process lets one process have the GPU (a second one, a stray CUDA init in a
    DataLoader worker or every rank on cuda:0, fails); MIG splits it into instances NCCL cannot
    join."""
    problems = []
    for gpu in needed:
        if str(gpu.get("compute_mode") or "").lower() == "exclusive_process":
            problems.append(_problem(
                host, "gpu compute mode", f"{_gpu(gpu)} shared (compute mode Default)",
                "Exclusive_Process: a second process on it fails",
                f"nvidia-smi -i {gpu.get('index')} -c DEFAULT as root where anything but one "
                "rank touches it"))
        if str(gpu.get("mig_mode") or "").lower() == "enabled":
            problems.append(_problem(
                host, "mig", f"{_gpu(gpu)} whole (MIG off)", "MIG enabled",
                f"nvidia-smi -i {gpu.get('index')} -mig 0 as root (then reset the GPU); NCCL "
                "does not communicate between MIG instances"))
    return problems


def gpu_arch_ptx(host, f, needed, plan):
    """A GPU that the build has only PTX for: the driver compiles every kernel at its first
    launch (minutes, each process; cached in ~/.nv/ComputeCache)."""
    arch_list = f["torch"].get("arch_list") or []
    return [_problem(host, "gpu arch", f"sm_{cap.replace('.', '')} kernels in torch "
                     f"{f['torch'].get('version')}", f"only PTX ({' '.join(arch_list)})",
                     "install a torch build with kernels for this GPU, or expect the first "
                     "steps to take minutes while the driver compiles")
            for cap in _caps(needed) if arch_list and arch_support(cap, arch_list) == "ptx"]


def memlock(host, f, needed, plan):
    """RDMA locks (registers) the buffers NCCL sends from: a small ulimit -l fails it."""
    limit = f.get("memlock")
    if not _ib_used(plan, f) or limit in (None, "unlimited"):
        return []
    return [_problem(host, "memlock", "ulimit -l unlimited where NCCL uses InfiniBand/RoCE",
                     _mib(int(limit)),
                     "set memlock unlimited for the job's user (/etc/security/limits.conf: "
                     "'* - memlock unlimited'; LimitMEMLOCK=infinity for sshd's unit; "
                     "--ulimit memlock=-1 for a container)")]


# The warnings of the GPUs a node's processes use and NCCL's needs, for nccl jobs.
GPU_WARNINGS = (persistence, gpu_memory_errors, xid_errors, gpu_sharing, gpu_arch_ptx, memlock)


def _rows(hosts, facts, interfaces, gpu_counts, nprocs):
    """The table's rows, one per host."""
    rows = []
    for host in hosts:
        f = facts.get(host)
        iface = interfaces.get(host) or {}
        if f:
            t = f["torch"]
            rows.append([host, f.get("hostname") or "", (f["python"].get("version") or "-"),
                         t.get("version") or "-", t.get("cuda") or "-", t.get("nccl") or "-",
                         str(gpu_counts.get(host, 0)), str(nprocs[host]),
                         f"{iface['name']} {iface['address']}" if iface else "-"])
        else:
            rows.append([host, "-", "-", "-", "-", "-", "-", str(nprocs[host]), "-"])
    return rows


def _interconnect(hosts, hostvars, job, facts):
    """The interconnect check's verdict (see _interconnect.judge) with every node's result;
    None where it did not run. The results are each node's C(torchherd_interconnect), or the
    measure of the same nodes that the preflight role reused (localhost's
    C(torchherd_interconnect_reused))."""
    reused = (hostvars.get("localhost") or {}).get("torchherd_interconnect_reused") or {}
    results = dict(reused.get("results") or {})
    if not results:
        for host in hosts:
            found = hostvars.get(host, {}).get("torchherd_interconnect")
            if isinstance(found, dict) and not found.get("skipped"):
                keys = ("allreduce", "pairs", "error", "seconds")
                results[host] = {k: found.get(k) for k in keys}
                if not found.get("allreduce") and not found.get("error"):
                    results[host]["error"] = str(found.get("msg") or "no result")[:300]
        if not results:
            return None
    speeds = {h: (f.get("interface") or {}).get("speed") for h, f in facts.items()}
    verdict = judge(hosts, results, job.get("interconnect_min_busbw") or 0.0,
                    job.get("interconnect_min_link_share") or 0.0, speeds)
    verdict["results"] = results
    verdict["reused"] = {"run_id": reused.get("run_id"), "at": reused.get("at")} \
        if reused.get("results") else None
    return verdict


def render(rows, problems, interconnect=None, warnings=(), left_out=None):
    head = ["node", "hostname", "python", "torch", "cuda", "nccl", "gpus", "procs", "interface"]
    lines = _table(head, rows)
    measure = (interconnect or {}).get("allreduce")
    if measure:
        threshold = interconnect.get("threshold_gbps")
        reused = interconnect.get("reused")
        lines += ["", f"interconnect: all-reduce bus bandwidth {measure['busbw']:.3g} GB/s, "
                      f"latency {measure['latency_us']:.0f} us ({measure['world_size']} ranks, "
                      f"{measure['bytes'] >> 20} MiB); "
                  + (f"threshold {threshold:.3g} GB/s ({interconnect['threshold_why']})"
                     if threshold else "no threshold")
                  + (f"; measured by run {reused['run_id']}" if reused else "")]
    for title, listed in (("problem(s)", problems),
                          ("warning(s), the job may start", warnings)):
        if not listed:
            continue
        lines += ["", f"{len(listed)} {title}:"]
        for p in listed:
            lines += [f"  {p['host']}: {p['check']}",
                      f"    expected: {p['expected']}",
                      f"    found:    {p['found']}",
                      f"    fix:      {p['fix']}"]
    if left_out:
        # The candidates the job does not run on (choose_nodes): why, in the problems' words.
        lines += ["", f"{len(left_out)} node(s) left out (the job runs on the nodes above):"]
        lines += [f"  {host}: {why}" for host, why in left_out.items()]
    return "\n".join(lines)


def _table(head, rows):
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    # The last column is left unpadded so long fixes do not widen every line.
    widths[-1] = 0
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


class FilterModule:
    """torchherd preflight filters."""

    def filters(self):
        return {"gate": gate}
