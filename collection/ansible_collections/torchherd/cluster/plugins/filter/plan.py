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
    nproc_per_node, world size, master address and port, and derives every per-node value the
    later phases use (root, code directory, Python, firewall settings), so that play vars only
    pass the plan on.
  - Takes the job through the validator of the role argument spec C(torchherd.cluster.plan)
    (ansible-core's C(ArgumentSpecValidator)), as the role and the driver do, so that all three
    coerce the same way and fill in the same defaults from one definition of the job.
  - Fails with one message listing every problem (empty group, host listed twice, two hosts with
    one address, port out of range, bad nproc_per_node, unknown master, a script outside
    code_src) before any node is touched.
positional: _input, groups, hostvars, run_id, playbook
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
    description:
      - The inventory's C(hostvars); C(torchherd_address), else C(ansible_host), else the name
        gives a node's address.
      - A node's C(torchherd_root), C(torchherd_python) (else C(ansible_python_interpreter)),
        C(torchherd_code_dest), C(torchherd_nproc_per_node), C(torchherd_socket_ifname) and
        C(torchherd_firewall_*) variables set its own values where nodes differ; strings from
        an INI inventory are coerced as Ansible coerces booleans and lists.
    type: dict
    required: true
  run_id:
    description: Run id for a job that names none (the role generates it); the job's own wins.
    type: str
    default: ""
  playbook:
    description:
      - The playbook the plan is for. A C(launch) needs the job's script; a C(verify) checks the
        nodes also without one (a job-less verify).
    type: str
    default: launch
    choices: [launch, verify]
  exclude:
    description:
      - Nodes to leave out from the start, each with why (the driver's restart after a node
        was lost, C(torchherd_exclude)). A spare takes an excluded node's place (its node rank);
        without one the job runs on fewer nodes where C(min_node_count) allows.
    type: dict
  chosen:
    description:
      - The job's nodes in rank order, as C(torchherd.cluster.choose_nodes) took them after
        preflight (healthy spares in the place of nodes that failed it). Without it the nodes
        are the first C(node_count) of the node group, those not marked C(torchherd_spare)
        first, and the rest are the plan's RV(_value.spares).
    type: list
    elements: str
  standbys:
    description:
      - Those of O(chosen) that wait as standbys (C(torchherd.cluster.choose_nodes) keeps the
        healthy spares left for a detached job that allows restarts, whose restarts are
        torchrun's own). They are started with the others and are not counted in C(nnodes) or
        the world size.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Compute the plan
  ansible.builtin.set_fact:
    torchherd_plan: "{{ torchherd_job | torchherd.cluster.plan(groups, hostvars, run_id='20250101-120000-0a1b') }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    run_id:
      description: The job's run id, else the O(run_id) argument.
      type: str
      sample: 20250101-120000-0a1b
    job:
      description:
        - The job, coerced as the argument spec says, with every default filled in.
        - C(secret_env) keeps its names only, each value replaced by C(********) (filter
          C(torchherd.cluster.redact)), because the plan is a fact, which Ansible shows and
          result callbacks record. The start takes the values from C(torchherd_job) itself.
      type: dict
    nodes:
      description: One entry per node, in rank order.
      type: list
      elements: dict
      contains:
        host:
          description: Inventory hostname.
          type: str
          sample: node0
        address:
          description: Address the other nodes reach it at.
          type: str
          sample: 10.0.0.1
        node_rank:
          description: torchrun's C(--node-rank).
          type: int
          sample: 0
        root:
          description: The node's C(torchherd_root), default C(~/.torchherd).
          type: str
          sample: ~/.torchherd
        code_dir:
          description:
            - Where the code goes on the node, the node's C(torchherd_code_dest), else the job's
              C(code_dest), else C(<root>/code/<name>); may start with C(~).
          type: str
          sample: ~/.torchherd/code/train
        python:
          description:
            - The node's C(torchherd_python), else the job's C(python), else the node's
              C(ansible_python_interpreter), else empty.
            - With the job's C(venv), the interpreter of the node's venv (C(<root>/venvs/<key>/bin/python)).
            - With the job's C(container), the image's, C(container.python) (C(python3)) unless
              the node or the job names another.
          type: str
          sample: /opt/venv/bin/python
        venv:
          description:
            - Only with the job's C(venv) - the node's venv, C(path) (C(<root>/venvs/<key>)),
              C(key) (a hash of the lock, of C(system_site_packages) and of C(base_python)) and
              C(base_python), the interpreter it is made from (what C(python) would be without
              a venv).
          type: dict
        nproc_per_node:
          description: The node's C(torchherd_nproc_per_node), else the job's; an integer or C(auto).
          type: raw
          sample: 2
        interface:
          description:
            - The interface the user named for the job's traffic on this node (the node's
              C(torchherd_socket_ifname), else the job's C(socket_ifname)); empty lets preflight
              choose it by the route to the master address.
          type: str
          sample: ib0
        standby:
          description:
            - Only on a standby (O(standbys)) - true. torchrun's elastic rendezvous holds it
              back while the job has its nodes, and takes it in when a restart finds one lost.
          type: bool
        firewall:
          description: The node's firewall settings, the job's unless the node sets C(torchherd_firewall_*) itself.
          type: dict
          contains:
            enabled:
              description: Whether the launch changes this node's firewall.
              type: bool
            mode:
              description: C(members) or C(ports).
              type: str
            ports:
              description: TCP ports and ranges let in with mode C(ports), the master port first on the master.
              type: list
              elements: str
              sample: ["29500", "50000-50999"]
            peers:
              description: Addresses of the job's other nodes.
              type: list
              elements: str
            backend:
              description: The node's C(torchherd_firewall_backend), default C(auto).
              type: str
            persistent:
              description: Keep the rules across a reboot until teardown.
              type: bool
            become:
              description: Whether changing the firewall uses become (C(torchherd_firewall_become), default true).
              type: bool
    nnodes:
      description:
        - Number of nodes (C(MIN:MAX) for elastic jobs), standbys not counted.
        - A detached job that allows restarts has C(MIN:MAX) from its C(min_node_count) and its
          nodes, so that torchrun's rendezvous is full without the standbys.
      type: str
    nproc_per_node:
      description: Processes per node, or C(auto) until preflight resolves it; null when the
        nodes set different counts (see each node's).
      type: raw
    world_size:
      description: Total number of ranks (the sum over the nodes), or null while a node's
        nproc_per_node is C(auto).
      type: int
    spares:
      description:
        - Nodes preflight checks beside the job's nodes (the job's C(node_count) is smaller than
          the node group, or hosts are marked C(torchherd_spare)), each an entry like those of
          RV(_value.nodes) with C(node_rank) null. C(torchherd.cluster.choose_nodes) takes the
          first healthy ones for nodes that failed preflight. Empty otherwise.
      type: list
      elements: dict
    min_nodes:
      description: The fewest nodes the job accepts (its C(min_node_count), else all of them).
      type: int
    excluded:
      description: The nodes O(exclude) left out, and why.
      type: dict
    left_out:
      description: Only after C(torchherd.cluster.choose_nodes) - each candidate left out and
        why (its preflight problems, or a spare not needed; a detached job that allows
        restarts keeps its healthy spares as standbys instead).
      type: dict
    master:
      description: C(host), C(addr) and C(port) of the rendezvous master.
      type: dict
    container:
      description: The job's C(container) - C(image), C(runtime), C(pull), C(python) (the
        interpreter in the image, every node's C(python) unless the node or the job names
        another) - null without an image.
      type: dict
    venv:
      description: The hash of the job's C(venv.lock) and C(venv.system_site_packages), null
        without a lock (which is read on the controller, and refused unless every requirement
        is pinned).
      type: str
    barrier:
      description: Whether the start's barrier is on (false where a node's
        C(torchherd_torchrun_barrier) turns it off); the schedule decides where it runs.
      type: bool
    warm:
      description: Whether the launcher may be started ahead, in preflight (false where a node's
        C(torchherd_torchrun_warm) turns it off); the schedule decides whether it is.
      type: bool
"""

import copy
import functools
import hashlib
import os
import re
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.validation import check_type_list
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.torchherd.cluster.plugins.filter.redact import redact
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS

SPEC_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "roles", "plan", "meta", "argument_specs.yml",
)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_NNODES = re.compile(r"^(\d+):(\d+)$")
DEFAULT_ROOT = "~/.torchherd"


@functools.lru_cache(maxsize=1)
def _spec():
    # libyaml where PyYAML has it: the pure-Python parser takes a tenth of a second for this
    # file, on every launch's critical path.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(SPEC_PATH, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader)["argument_specs"]["main"]["options"]


def job_spec():
    """The C(main) options of the plan role's argument spec (the one definition); parsed once
    per process (the plan is made more than once per launch), a copy each time (the validator
    may change what it is given)."""
    return copy.deepcopy(_spec())


def _plain(value):
    """`value` as plain Python data. Ansible hands a filter its own lazy containers and tagged
    values, which the validator deep-copies with everything they carry (origins, templating
    state): over a second per plan where plain data takes milliseconds."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def normalize(job):
    """The job as the role's argument validation sees it, coerced and with defaults.

    Role validation checks the job but hands the plan the raw values (C(firewall: "off") is a
    true string), so the plan runs the same validator to take the coerced ones. It also refuses,
    with Ansible's own words, a job that skipped validation (rolespec_validate false)."""
    given = {k: _plain(v) for k, v in job.items() if v is not None}
    result = ArgumentSpecValidator(job_spec()).validate({"torchherd_job": given})
    if result.error_messages:
        raise AnsibleFilterError("torchherd plan: Validation of arguments failed:\n"
                                 + "\n".join(result.error_messages))
    return result.validated_parameters["torchherd_job"]


def _vars(name, hostvars):
    """The node's variables; read through the hostvars mapping, which templates on access."""
    # Not hostvars.get(): Ansible's hostvars answers an unknown host with an undefined marker.
    return hostvars[name] if name in hostvars else {}  # noqa: SIM401


def _address(hv, name):
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


def _host_setting(name, hv, key, default, coerce, problems):
    """A host's own setting of a firewall variable, coerced as Ansible coerces its options:
    an INI inventory gives every value as a string ("false", "1", "50000-50999")."""
    if hv.get(key) is None:
        return default
    try:
        return coerce(hv[key])
    except TypeError as exc:
        problems.append(f"host {name}: {key}: {exc}; fix: correct it in the inventory")
        return default


def _firewall(name, hv, job, addresses, master, port, problems):
    """One node's firewall settings: the job's, unless the host sets its own."""
    ports = _host_setting(name, hv, "torchherd_firewall_ports", job["firewall_ports"],
                          check_type_list, problems)
    return {
        "enabled": _host_setting(name, hv, "torchherd_firewall_enabled", job["firewall"],
                                 boolean, problems),
        "mode": str(hv.get("torchherd_firewall_mode") or job["firewall_mode"]),
        "ports": ([str(port)] if name == master else []) + [str(p) for p in ports],
        "peers": [addr for host, addr in addresses.items() if host != name],
        "backend": str(hv.get("torchherd_firewall_backend") or "auto"),
        "persistent": _host_setting(name, hv, "torchherd_firewall_persistent",
                                    job["firewall_persistent"], boolean, problems),
        "become": _host_setting(name, hv, "torchherd_firewall_become", True, boolean, problems),
    }


def _script(script, code_src, problems):
    """The script as the nodes run it: relative to the code directory the sync fills. The
    start runs it there, so an absolute path inside code_src becomes relative to it, and one
    outside would never reach the nodes (only the code directory is synced): a problem."""
    if not os.path.isabs(script):
        return script
    src = os.path.realpath(os.path.expanduser(code_src or "."))
    # The directory resolved as code_src is, the file not: a link in code_src is the code's.
    inside = os.path.relpath(os.path.join(os.path.realpath(os.path.dirname(script)),
                                          os.path.basename(script)), src)
    if inside == os.pardir or inside.startswith(os.pardir + os.sep):
        problems.append(f"job.script: expected a path inside code_src {src} (the directory "
                        f"synced to the nodes), found {script}; fix: put the script under "
                        f"code_src and give its path relative to it, or set code_src to a "
                        f"directory that holds it")
        return script
    return inside


def _container(job, problems):
    """The job's image, runtime, pull policy and interpreter (None without an image)."""
    spec = job.get("container") or {}
    if not spec.get("image"):
        unused = sorted(k for k, v in spec.items() if v not in (None, "", [], "auto", "missing",
                                                                "python3"))
        if unused:
            problems.append(f"job.container: expected an image with {', '.join(unused)}, found "
                            "none; fix: set container.image, or leave container out")
        return None
    if (job.get("venv") or {}).get("lock"):
        problems.append("job.container and job.venv: expected one of them (a venv is made on "
                        "the node, an image brings its own interpreter), found both; fix: "
                        "install the lock into the image, or leave container out")
    if job.get("spawn") == "srun":
        problems.append("job.container with spawn srun: expected spawn ssh or auto, found "
                        "srun; fix: run the image with SLURM's own container support "
                        "(srun --container-image), or set spawn to ssh")
    return {"image": str(spec["image"]), "runtime": str(spec.get("runtime") or "auto"),
            "pull": str(spec.get("pull") or "missing"),
            "python": str(spec.get("python") or "python3")}


def _venv(job, problems):
    """The hash of the job's lock and of what else shapes its venv (None without a lock).

    The lock is read here, on the controller, so that a lock that is missing or pins nothing is
    refused before any node is touched; preflight sends its text to the nodes."""
    spec = job.get("venv") or {}
    if not spec.get("lock"):
        return None
    src = os.path.realpath(os.path.expanduser(job.get("code_src") or "."))
    path = os.path.join(src, spec["lock"])
    uv_lock = os.path.basename(path) == "uv.lock"
    # uv's own lock pins by construction; it is its project's, whose pyproject.toml is beside it.
    wanted = [(path, f"a lock file inside code_src {src}",
               "give its path relative to code_src (uv pip compile requirements.in -o "
               "requirements.lock makes one)")]
    if uv_lock:
        wanted.append((os.path.join(os.path.dirname(path), "pyproject.toml"),
                       f"pyproject.toml beside {spec['lock']} (uv's lock is its project's)",
                       "sync the project's directory, or export a requirements lock (uv export "
                       "--format requirements-txt -o requirements.lock)"))
    texts = []
    for where, expected, fix in wanted:
        try:
            with open(where, encoding="utf-8") as handle:
                texts.append(handle.read())
        except OSError as exc:
            problems.append(f"job.venv.lock: expected {expected}, found "
                            f"{exc.strerror or exc} at {where}; fix: {fix}")
            return None
    loose = [] if uv_lock else unpinned(texts[0])
    if loose:
        problems.append(f"job.venv.lock: expected every requirement in {spec['lock']} pinned "
                        f"with == (a lock), found {', '.join(loose[:5])}; fix: make the lock "
                        f"with uv pip compile (or uv export --format requirements-txt)")
        return None
    texts.append(str(bool(spec.get("system_site_packages"))))
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()


def unpinned(text):
    """The requirements of a requirements file that pin no version (a lock pins them all)."""
    joined = re.sub(r"\\\n", " ", text)
    loose = []
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if not line or line.startswith(("--hash", "--index-url", "--extra-index-url",
                                        "--find-links", "--no-index", "-i ", "-f ")):
            continue
        requirement = line.split(";", 1)[0].split(" --hash", 1)[0].strip()
        if line.startswith("-") or not (re.search(r"[^=!<>~]===?[^=]", requirement)
                                        or " @ " in requirement):
            loose.append(requirement)
    return loose


def _node_count(job, candidates, hvs, chosen, exclude, problems):
    """(the job's nodes in rank order, the spares behind them).

    The nodes are the first C(node_count) of the candidates, those not marked
    C(torchherd_spare) first (inventory order each); the rest wait as spares. Without
    C(node_count) the job takes every node not marked a spare. An excluded node's place goes
    to the first spare left (its node rank), or stays empty."""
    if chosen is not None:
        return list(chosen), []
    spare = {}
    for name in candidates:
        spare[name] = _host_setting(name, hvs[name], "torchherd_spare", False, boolean, problems)
    order = [n for n in candidates if not spare[n]] + [n for n in candidates if spare[n]]
    wanted = job["node_count"] or sum(1 for n in candidates if not spare[n]) or len(candidates)
    if candidates and not 1 <= wanted <= len(candidates):
        problems.append(f"job.node_count: expected 1..{len(candidates)} (the nodes of the "
                        f"inventory, spares included), found {job['node_count']!r}; fix: lower "
                        f"it or add nodes")
    if not 0 <= job["min_node_count"] <= wanted:
        problems.append(f"job.min_node_count: expected 0..{wanted} (node_count; 0 means "
                        f"node_count), found {job['min_node_count']!r}; fix: lower it")
    nodes, spares = order[:wanted], [n for n in order[wanted:] if n not in exclude]
    nodes = [n if n not in exclude else (spares.pop(0) if spares else None) for n in nodes]
    nodes = [n for n in nodes if n]
    fewest = min(wanted, job["min_node_count"] or wanted)
    if exclude and len(nodes) < fewest:
        problems.append(f"nodes: expected at least {fewest} (min_node_count, else node_count) "
                        f"besides those left out ({', '.join(sorted(exclude))}), found "
                        f"{len(nodes)}; fix: add spares (torchherd_spare) or lower "
                        f"min_node_count")
    return nodes, spares


def healthy_choice(plan_, gate_):
    """The nodes a job of ``plan_`` runs on after preflight's verdict ``gate_`` on every
    candidate (its nodes and spares), and {host: why} of those left out; None where the nodes
    cannot be chosen (a problem of no single node, too few healthy ones, or an unhealthy master
    the job names)."""
    nodes = [n["host"] for n in plan_["nodes"]]
    spares = [n["host"] for n in plan_.get("spares") or []]
    problems = {}
    for problem in gate_.get("problems") or []:
        host = problem.get("host")
        if host not in nodes and host not in spares:
            return None  # between two nodes, or the launch's own: no spare helps
        problems.setdefault(host, []).append(f"{problem['check']}: {problem['found']}")
    healthy = [s for s in spares if s not in problems]
    chosen = [n if n not in problems else (healthy.pop(0) if healthy else None) for n in nodes]
    chosen = [n for n in chosen if n]
    master = (plan_["job"].get("master") or "")
    if len(chosen) < plan_.get("min_nodes", len(nodes)) or (master and master not in chosen):
        return None
    # A detached job's restarts are torchrun's: the healthy spares left wait in its rendezvous.
    standbys = healthy if standby_mode(plan_["job"]) else []
    left_out = {h: "; ".join(problems[h]) for h in nodes + spares if h in problems}
    left_out.update({h: "a spare the job did not need" for h in spares
                     if h not in chosen and h not in problems and h not in standbys})
    return chosen + standbys, left_out, standbys


def choose_nodes(plan_, gate_, groups, hostvars):
    """The plan again on the healthy nodes (see RETURN of the filter docs): a spare takes the
    place (the node rank) of a node that failed preflight, the master is the first chosen node
    unless the job names one, and every value that follows from the nodes (ranks, firewall
    peers, the master port's rule, nnodes, world size) is the plan filter's own. Unchanged where
    the plan has no spares or no choice can save the launch (the gate then refuses it as
    without spares)."""
    if not plan_.get("spares"):
        return plan_
    choice = healthy_choice(plan_, gate_)
    if choice is None:
        return plan_
    chosen, left_out, standbys = choice
    # The plan's own job (normalized; secret values redacted, which no node-derived value
    # reads). The script was checked by the first plan; it is the same job.
    again = plan(plan_["job"], groups, hostvars, run_id=plan_["run_id"], playbook="verify",
                 chosen=chosen, standbys=standbys)
    result = dict(plan_)
    result.update({key: again[key] for key in ("nodes", "nnodes", "nproc_per_node",
                                               "world_size", "master", "barrier")})
    result.update(spares=[], left_out={**plan_.get("excluded", {}), **left_out})
    return result


def standby_mode(job):
    """Whether the job's restarts are torchrun's own, on the nodes (a detached job that allows
    restarts): the spares then wait in its elastic rendezvous as standbys (see the schedule's
    restart.by)."""
    return bool(job.get("detach")) and int(job.get("restarts") or 0) > 0


def _standby_problems(merged):
    """Why a detached job with restarts cannot have them on its nodes (torchrun's elastic
    restarts, which need no controller), or nothing."""
    if not standby_mode(merged):
        return []
    problems = []
    fix = "; fix: {}, or launch without detach (the driver's watch then restarts the job)"
    if merged["launcher"] != "torchrun" or merged["rdzv"] != "c10d":
        problems.append(
            f"job.restarts with detach: expected launcher torchrun with rdzv c10d (a detached "
            f"job's restarts are torchrun's own elastic restarts, whose rendezvous takes a "
            f"standby spare in), found launcher {merged['launcher']} with rdzv {merged['rdzv']}"
            + fix.format("set rdzv: c10d"))
    if "exception" not in (merged.get("restart_on") or []):
        problems.append(
            f"job.restart_on with detach: expected it to name exception too (torchrun restarts "
            f"its workers after any failure, an exception of the job's own code included, and "
            f"cannot tell the kinds apart), found {', '.join(merged.get('restart_on') or [])}"
            + fix.format("add exception to restart_on"))
    if merged["max_restarts"] not in (0, merged["restarts"]):
        problems.append(
            f"job.max_restarts with detach and restarts: expected 0 or {merged['restarts']} "
            f"(torchrun's restarts are the job's restarts then), found {merged['max_restarts']}"
            + fix.format("drop max_restarts"))
    return problems


def plan(job, groups, hostvars, run_id="", playbook="launch", chosen=None, exclude=None,
         standbys=()):
    """Return the launch plan for ``job``; raise AnsibleFilterError listing every problem.

    ``run_id`` is the one the plan role generates for a job that names none: the filter
    stays pure (no clock, no randomness). ``chosen`` (from C(choose_nodes)) names the nodes of
    the job, in rank order, after preflight took healthy ones for unhealthy ones, and
    ``standbys`` those of them that wait as standbys (the last ones)."""
    if not isinstance(job, dict):
        raise AnsibleFilterError(
            f"torchherd_job: expected a dict (the job spec), found {type(job).__name__}"
        )
    merged = normalize(job)
    problems = []

    script = str(merged.get("script") or "").strip()
    if not script and playbook != "verify":
        problems.append("job.script: expected the training script's path, found nothing; "
                        "fix: set torchherd_job.script (e.g. train.py)")
    script = _script(script, merged["code_src"], problems)

    group = merged["node_group"]
    members = list(groups.get(group) or [])
    explicit = merged["nodes"]
    names = explicit or members
    if not members:
        problems.append(f"node group '{group}': expected at least one host, found the group "
                        f"empty or missing from the inventory; fix: list the nodes under "
                        f"[{group}] in the inventory or set torchherd_job.node_group (an "
                        f"inventory that Ansible could not parse leaves every group empty: see "
                        f"its warnings above, or set inventory_unparsed_failed = True)")
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
    candidates = list(dict.fromkeys(names))
    hvs = {name: _vars(name, hostvars) for name in candidates}
    exclude = dict(exclude or {})
    nodes, spares = _node_count(merged, candidates, hvs, chosen, exclude, problems)
    addresses = {name: _address(hvs[name], name) for name in candidates}

    by_address = {}
    for name, address in addresses.items():
        by_address.setdefault(address, []).append(name)
    for address, owners in by_address.items():
        if len(owners) > 1:
            problems.append(f"hosts {', '.join(owners)}: expected one address per node, found "
                            f"all of them at {address}; fix: give each node its own "
                            f"ansible_host (or torchherd_address), or remove the duplicate entry")

    port = merged["master_port"]
    if not 1 <= port <= 65535:
        problems.append(f"job.master_port: expected an integer in 1..65535, found "
                        f"{port!r}; fix: set torchherd_job.master_port "
                        f"(torchrun's default is 29500)")

    nproc = _nproc(merged["nproc_per_node"])
    if nproc is None:
        problems.append(f"job.nproc_per_node: expected a positive integer or 'auto', found "
                        f"{merged['nproc_per_node']!r}; fix: set it to the GPUs per node, "
                        f"or 'auto'")
    # Nodes with other GPU counts set their own: torchrun gives each process its global rank
    # from the counts of the nodes before it.
    nprocs = {}
    for name in candidates:
        own = hvs[name].get("torchherd_nproc_per_node")
        nprocs[name] = nproc if own is None else _nproc(own)
        if own is not None and nprocs[name] is None:
            problems.append(f"host {name}: torchherd_nproc_per_node: expected a positive "
                            f"integer or 'auto', found {own!r}; fix: correct it in the "
                            f"inventory")

    master = merged["master"] or (nodes[0] if nodes else "")
    if merged["master"] and master not in nodes:
        problems.append(f"job.master: expected one of the nodes ({', '.join(nodes)}), found "
                        f"{master!r}; fix: name a host of group '{group}' or leave it empty")

    standbys = [n for n in standbys if n in nodes]
    working = [n for n in nodes if n not in standbys]  # the nodes the job's world counts
    problems += _standby_problems(merged)
    nnodes = str(len(working))
    if standby_mode(merged):
        # torchrun's rendezvous takes up to the job's nodes; a standby waits for a lost one.
        nnodes = f"{min(len(working), merged['min_node_count'] or len(working))}:{len(working)}"
    if merged["nnodes"]:
        match = _NNODES.match(merged["nnodes"].strip())
        if merged["rdzv"] != "c10d":
            problems.append(f"job.nnodes: expected it empty with rdzv 'static' (the node count "
                            f"is the inventory's), found {merged['nnodes']!r}; fix: drop it or "
                            f"set rdzv: c10d")
        elif not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
            problems.append(f"job.nnodes: expected MIN:MAX with 1 <= MIN <= MAX, found "
                            f"{merged['nnodes']!r}; fix: e.g. nnodes: '2:{len(nodes) or 3}'")
        elif int(match.group(2)) < len(working) or int(match.group(1)) > len(working):
            problems.append(f"job.nnodes: expected MIN <= {len(working)} nodes <= MAX, found "
                            f"{merged['nnodes']!r}; fix: widen the range or change the group")
        elif standby_mode(merged) and int(match.group(2)) != len(working):
            problems.append(f"job.nnodes: expected MAX {len(working)} with detached restarts "
                            f"(a standby waits only while the rendezvous is full), found "
                            f"{merged['nnodes']!r}; fix: drop nnodes (min_node_count sets MIN)")
        else:
            nnodes = f"{int(match.group(1))}:{int(match.group(2))}"

    if merged["spawn"] == "srun":
        # Spares too: one may take a node's place after preflight.
        outside = [n for n in nodes + spares if not hvs[n].get("torchherd_slurm_job_id")]
        if outside:
            problems.append(f"job.spawn: expected nodes of a SLURM job (the "
                            f"torchherd.cluster.slurm inventory) for spawn srun, found "
                            f"{', '.join(outside)} outside one; fix: use that inventory, or "
                            f"spawn ssh")

    launcher = LAUNCHERS[merged["launcher"]]
    problems += launcher.constraints(merged, {h: nprocs[h] for h in nodes})
    for arg in merged["launcher_args"]:
        option = str(arg).split("=", 1)[0]
        if option in launcher.PLANNED_OPTIONS:
            problems.append(f"job.launcher_args: expected options of {launcher.NAME} that the plan "
                            f"does not set, found {option}; fix: leave it out (torchherd sets it "
                            f"from the inventory and the job: node rank, node count, master "
                            f"address and port, processes per node, logs)")

    for key, low in (("max_restarts", 0), ("timeout", 0), ("watch_interval", 1),
                     ("hang_timeout", 0), ("interconnect_max_age", 0)):
        if merged[key] < low:
            problems.append(f"job.{key}: expected an integer >= {low}, found {merged[key]!r}")
    for key in ("probe_timeout", "probe_window"):
        if merged[key] <= 0:
            problems.append(f"job.{key}: expected a number of seconds > 0, found {merged[key]!r}")
    for key in ("interconnect_min_busbw", "interconnect_min_link_share"):
        if merged[key] < 0:
            problems.append(f"job.{key}: expected a number >= 0, found {merged[key]!r}")

    run_id = merged["run_id"] or run_id
    for key, value in (("run_id", run_id), ("name", merged["name"])):
        if value and not _SAFE_ID.match(str(value)):
            problems.append(f"job.{key}: expected letters, digits, '.', '_' or '-' (it names "
                            f"directories), found {value!r}")

    name = merged["name"] or os.path.splitext(os.path.basename(script))[0] or "job"
    if not _SAFE_ID.match(name):
        name = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip("._-") or "job"
    firewalls = {h: _firewall(h, hvs[h], merged, {n: addresses[n] for n in nodes}, master,
                              port, problems)
                 for h in candidates}
    # The start barrier is the whole launch's (a node without it would never come to it): off
    # where any node's torchherd_torchrun_barrier turns it off.
    # (Every node's setting is read, so that each bad one is named.)
    barriers = [_host_setting(h, hvs[h], "torchherd_torchrun_barrier", True, boolean, problems)
                for h in candidates]
    barrier = False not in barriers
    # The launcher started ahead in preflight (the schedule's start.warm): off where any node's
    # torchherd_torchrun_warm turns it off.
    warm = False not in [_host_setting(h, hvs[h], "torchherd_torchrun_warm", True, boolean,
                                       problems) for h in candidates]

    # gloo and NCCL connect between the nodes on ports the kernel picks: mode ports without
    # ports (the master port is the rendezvous's alone) would let the rendezvous through and
    # block the collectives (a hang at init).
    if len(nodes) > 1 and any(f["enabled"] and f["mode"] == "ports"
                              and len(f["ports"]) == (1 if h == master else 0)
                              for h, f in firewalls.items()):
        problems.append("job.firewall_ports: expected the ports gloo and NCCL use with "
                        "firewall_mode ports, found none; fix: pin them to a range "
                        "(net.ipv4.ip_local_port_range on every node) and list it in "
                        "firewall_ports, or use firewall_mode members (see the firewall "
                        "role's README.md)")

    venv = _venv(merged, problems)
    container = _container(merged, problems)

    if problems:
        raise AnsibleFilterError("torchherd plan: the job cannot start:\n  - "
                                 + "\n  - ".join(problems))

    merged["name"] = name
    merged["script"] = script
    merged["nproc_per_node"] = nproc
    root_of = {h: str(hvs[h].get("torchherd_root") or DEFAULT_ROOT) for h in candidates}
    uniform = list(dict.fromkeys(nprocs[h] for h in nodes))

    def entry(h, rank):
        # In the job's image the interpreter is the image's (the node's own is not there).
        python = str(hvs[h].get("torchherd_python") or merged["python"]
                     or (container["python"] if container else
                         hvs[h].get("ansible_python_interpreter")) or "")
        own = {}
        if venv:
            # The node's venv: its key also hashes the interpreter it is made from.
            key = hashlib.sha256(f"{venv}\0{python}".encode()).hexdigest()[:16]
            own["venv"] = {"path": f"{root_of[h]}/venvs/{key}", "key": key,
                           "base_python": python}
            python = f"{root_of[h]}/venvs/{key}/bin/python"
        return {"host": h, "address": addresses[h], "node_rank": rank, "root": root_of[h],
                "code_dir": str(hvs[h].get("torchherd_code_dest") or merged["code_dest"]
                                or f"{root_of[h]}/code/{name}"),
                "python": python, **own,
                "nproc_per_node": nprocs[h],
                "interface": str(hvs[h].get("torchherd_socket_ifname")
                                 or merged["socket_ifname"] or ""),
                "firewall": firewalls[h],
                # Started as the others, it waits in torchrun's rendezvous for a lost node.
                **({"standby": True} if h in standbys else {})}

    return {
        "run_id": run_id,
        "job": redact(merged),
        # The hash of the job's lock (None without one); each node's venv is in its entry.
        "venv": venv,
        # The job's image (None without one): every node runs the launcher inside it.
        "container": container,
        "nodes": [entry(h, i) for i, h in enumerate(nodes)],
        # Candidates preflight checks beside the nodes; C(choose_nodes) puts the first healthy
        # ones in the place of nodes that failed it. Empty where the job takes every node.
        "spares": [entry(h, None) for h in spares],
        "min_nodes": min(len(working), merged["min_node_count"] or len(working)),
        # Nodes this launch leaves out from the start, and why (the driver's restart).
        "excluded": {h: str(why) for h, why in exclude.items() if h in candidates},
        "nnodes": nnodes,
        "nproc_per_node": uniform[0] if len(uniform) == 1 else None,
        "world_size": None if "auto" in uniform else sum(nprocs[h] for h in working),
        "master": {"host": master,
                   "addr": merged["master_addr"] or addresses[master],
                   "port": port},
        "barrier": barrier,
        "warm": warm,
    }


class FilterModule:
    """torchherd planning filters."""

    def filters(self):
        return {"plan": plan}
