# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The arguments of the two module calls of a launch that every node makes, from the plan, the
schedule and what preflight found: preflight's facts call (module torchherd.cluster.node_facts,
filter facts_args) and the start (module torchherd.cluster.torchrun_job, state started, filter
start_args). In Python, once per node, where the same arguments as a task's Jinja were compiled
and rendered again in every worker, one per node (some sixty templates for the start alone).
The task files (roles/preflight/tasks/main.yml, roles/torchrun/tasks/start.yml) hand each
answer on whole, as the module's option `arguments`, which the module's action spreads into
its arguments (spread_arguments). Not through Ansible's `args` keyword: a template there makes
ansible-core warn that it is unsafe, on every task and every launch, since a fact of a node
could then add a module argument of its own."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail

from ansible_collections.torchherd.cluster.plugins.plugin_utils._schedule.nodes import (
    Node,
    decide_node,
)


def spread_arguments(task_args):
    """A task's arguments with its option ``arguments`` (one of the filters' answers, handed on
    whole) spread into them; an option the task gives on its own wins."""
    given = dict(task_args)
    whole = given.pop("arguments", None) or {}
    if not isinstance(whole, dict):
        raise AnsibleActionFail(f"arguments: expected a mapping of the module's options, "
                                f"found {type(whole).__name__}")
    return {**whole, **given}


def job_secrets(templar, task_vars, name):
    """The secret values (secret_env) of the job that variable ``name`` holds, templated at run
    time by an action: no task argument holds them (callbacks see every task's arguments)."""
    job = templar.template((task_vars or {}).get(name) or {})
    secrets = job.get("secret_env") if isinstance(job, dict) else None
    if not isinstance(secrets or {}, dict):
        raise AnsibleActionFail(f"secret_env_var {name}: expected its secret_env to be a "
                                f"mapping of names to values, found {type(secrets).__name__}")
    return dict(secrets or {})


def facts_args(plan, schedule, node, code, host, cache_seconds, prior=None, grace=None):
    """The arguments of the node's facts call (see filter facts_args), but its venv, which the
    task reads from the job's lock file on the controller where the node has one. Where the
    schedule has the start come with it (start.with_facts), also the start's arguments, computed
    from ``prior`` (plan_run's: the last preflight of the same job on the same nodes), and what
    the node's facts must be for it to go on; ``grace``: the start's."""
    master = plan["master"]
    # Where spares may make another node the master, every node's port is looked at. A job whose
    # master_port is auto has the master pick a free one (the gate's master_port).
    looked_at = host == master["host"] or bool(plan.get("spares"))
    container = plan.get("container")
    job = plan["job"]
    args = {
        "python": node["python"],
        "root": node["root"],
        "port": master["port"] if master["port"] != "auto" and looked_at else 0,
        "pick_port": master["port"] == "auto" and looked_at,
        "cache_seconds": cache_seconds,
        # The code already on the node: where it is the controller's (code_current), a
        # relaunch skips the sync there.
        "code_dir": node["code_dir"],
        "code_files": (code or {}).get("files") or [],
        "code_expect": (code or {}).get("hash") or "",
        # The interface of the job's traffic: the one the user named, else the route's to the
        # master.
        "master_addr": master["addr"],
        "interface": node.get("interface") or "",
        # The job's image: the runtime and the image found (or pulled) first; torch is read in
        # it.
        "container": {} if not container else {
            "image": container["image"], "runtime": container["runtime"], "pull": container["pull"],
            "volumes": (job.get("container") or {}).get("volumes") or [],
            "options": (job.get("container") or {}).get("options") or []},
        # The job's launcher, started ahead where the node's part of the schedule says so: it
        # imports torch while the launch goes on, and the start hands it the job.
        "warm": {"run_id": plan["run_id"], "module": schedule["start"]["module"],
                 "env": job.get("env"), "deadline": schedule["start"]["deadline"]}
        if schedule and decide_node(schedule, Node(entry=dict(node), facts={}, started={}))["start_ahead"]
        else {},
    }
    if prior and schedule and schedule["start"].get("with_facts"):
        args.update(_with_facts(plan, schedule, node, host, prior, grace, looked_at,
                                bool(args["warm"])))
    return args


def _with_facts(plan, schedule, node, host, prior, grace, looked_at, warm):
    """The start and what the facts must be for it (node_facts' start and start_expect), from
    the last preflight's verdict and this node's facts then; the master port picked then, where
    the job's is auto, is picked again where it is still free."""
    facts = prior["facts"][host]
    opens = decide_node(schedule, Node(entry=dict(node), facts=dict(facts), started={}))
    start = start_args(plan, schedule, prior["gate"], node, facts, host,
                       firewall=opens["firewall"] == "start", grace=grace, slurm={})
    # The launcher this very call starts ahead is handed the job, as on the full path.
    start["warm"] = warm
    said = {"start": start, "start_expect": prior["expect"][host]}
    if plan["master"]["port"] == "auto" and looked_at:
        said["prefer_port"] = prior["gate"]["master_port"]
    return said


def _gpus(facts):
    return int((facts.get("torch") or {}).get("gpu_count") or 0)


def _env(plan, gate, host, iface):
    """The interface preflight chose (or the user named) for the node, what the gate derived
    from its facts (NCCL_IB_HCA), then the job's own env, which wins."""
    env = {"GLOO_SOCKET_IFNAME": iface["name"], "NCCL_SOCKET_IFNAME": iface["name"]} if iface else {}
    env.update((gate.get("node_env") or {}).get(host) or {})
    env.update(plan["job"].get("env") or {})
    env["TORCHHERD_BACKEND"] = gate["backend"]
    return env


def _barrier(plan, schedule, host, iface):
    """The master-port probe and the start in one round trip (torchrun_job's barrier), or none
    where the schedule has no barrier."""
    if schedule["barrier"] == "none":
        return None
    job = plan["job"]
    return {
        "listen": host == plan["master"]["host"],
        "expect": schedule["nodes"],
        "timeout": job["probe_timeout"],
        "window": job["probe_window"],
        "source": (iface or {}).get("address") or "",
        "background": schedule["barrier"] == "supervisors",
    }


def _container(plan, facts):
    """The job's image as preflight found it on the node (run by its id), with its GPUs."""
    if not plan.get("container"):
        return None
    found = facts.get("container") or {}
    job = plan["job"].get("container") or {}
    return {
        "runtime": found.get("runtime"),
        "path": found.get("path"),
        "image": found.get("image"),
        "id": found.get("id") or "",
        "gpus": _gpus(facts) > 0,
        "volumes": job.get("volumes") or [],
        "options": job.get("options") or [],
    }


def _wrapper(plan, schedule, host, slurm):
    """Under spawn srun, the launcher runs as a step of the node's SLURM job."""
    if schedule["spawn"][host] != "srun":
        return []
    return [slurm["srun"], f"--jobid={slurm['job_id']}", f"--nodelist={slurm['node']}",
            "--nodes=1", "--ntasks=1", "--overlap", "--export=ALL",
            f"--job-name=torchherd-{plan['run_id']}"]


def start_args(plan, schedule, gate, node, facts, host, *, firewall, grace, slurm):
    """The arguments of the node's start (see the filter's RETURN). ``firewall``: whether the
    start opens the node's rules (the play's torchherd_torchrun_firewall); ``grace``: seconds
    between SIGTERM and SIGKILL; ``slurm``: srun, job_id and node, read under spawn srun only."""
    job = plan["job"]
    facts = facts or {}
    iface = (gate.get("interfaces") or {}).get(host) or {}
    torch = facts.get("torch") or {}
    args = {
        "state": "started",
        "run_id": plan["run_id"],
        # A whole-job restart (the driver's) starts again where the run ended.
        "restart": plan.get("restart", 0),
        "root": node["root"],
        "python": node["python"],
        "launcher": job["launcher"],
        "launcher_args": job["launcher_args"],
        # accelerate's multi-process mode needs its CPU switch on nodes without GPUs.
        "use_cpu": _gpus(facts) == 0,
        # The Flight Recorder's variable names follow the node's torch (module docs).
        "torch_version": torch.get("version") or "",
        "script": job["script"],
        "args": job["args"],
        "chdir": node["code_dir"],
        "nnodes": plan["nnodes"],
        "nproc_per_node": gate["nprocs"][host],
        "node_nprocs": [] if gate["nproc_per_node"]
        else [gate["nprocs"][n["host"]] for n in plan["nodes"]],
        "node_rank": node["node_rank"],
        "master_addr": plan["master"]["addr"],
        "master_port": gate["master_port"],
        "rdzv": job["rdzv"],
        # torchrun's own restarts: the job's max_restarts, or its restarts where the schedule
        # leaves them to torchrun (a detached job: restart.by torchrun).
        "max_restarts": schedule["restart"]["launcher"],
        "rdzv_conf": job["rdzv_conf"],
        "timeout": job["timeout"],
        "grace": grace,
        # The node's GPUs, CPU and memory sampled into its run record while the job runs.
        "sample_every": schedule["start"]["sample_every"],
        "env": _env(plan, gate, host, iface),
        # The run's description on the node (meta.json): ps tells whose run it is from it.
        "meta": {"host": host, "node_rank": node["node_rank"], "name": job["name"]},
        # The launcher preflight started ahead, where the node's part of the schedule hands it
        # the job.
        "warm": decide_node(schedule, Node(entry=dict(node), facts=dict(facts), started={}))["warm"],
        "wrapper": _wrapper(plan, schedule, host, slurm),
    }
    # Every node of a job whose restarts are torchrun's: one whose launcher ends without
    # workers waited as a standby (the plan's standbys start later, so that the job's own nodes
    # fill the rendezvous).
    if schedule["restart"]["by"] == "torchrun":
        args["standby"] = {"delay": schedule["restart"]["standby_delay"] if node.get("standby") else 0}
    # Where the schedule says so and the job runs as root anyway, the start opens the node's
    # rules in its own round trip, before the barrier, with the firewall's own code.
    if firewall:
        rules = node["firewall"]
        args["firewall"] = {key: rules[key] for key in ("peers", "mode", "ports", "backend", "persistent")}
    barrier = _barrier(plan, schedule, host, iface)
    if barrier is not None:
        args["barrier"] = barrier
    container = _container(plan, facts)
    if container is not None:
        args["container"] = container
    return args
