#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_facts
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Gather what a torchrun launch needs to know about one node, in one round trip
description:
  - Reports the job interpreter and its torch build (version, CUDA, NCCL, gloo, GPUs), the
    node's host name and addresses, whether the master port is free (or a free port it picked),
    free disk at torchherd's directory, and jobs of torchherd still running there.
  - Reports what NCCL and the GPUs need of the node as it is now - the processes holding its
    GPUs, the GPUs' modes and ECC state, Xid errors in the kernel log, the host identity NCCL
    uses, C(/dev/shm), the locked-memory limit, InfiniBand/RoCE ports - for the gate's checks.
  - Replaces C(gather_facts) for launches, with one module call per node and nothing else.
  - The torch probe runs in a subprocess of the job's interpreter, which may differ from the
    one running this module (a venv, say).
  - The GPUs are read without CUDA, from C(nvidia-smi --query-gpu) or else the NVIDIA driver's
    files under C(/proc/driver/nvidia), with C(CUDA_VISIBLE_DEVICES) applied; the torch probe
    then counts them through NVML and creates no CUDA context. Only where neither is there, or
    C(CUDA_VISIBLE_DEVICES) names MIG instances (or indices among GPUs of other models without
    C(CUDA_DEVICE_ORDER=PCI_BUS_ID)), does torch's CUDA list them.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.INFO_MODULE
  - torchherd.cluster._attributes.ACTION
  - torchherd.cluster._node_facts
  - torchherd.cluster._node_values.SPREAD
attributes:
  action:
    details:
      - The module runs on the node, with O(arguments) spread into its other arguments. Where
        ssh ended before Ansible could write the module to it (Ansible then reports only that
        the data could not be sent), the action asks the node once more with a command that
        sends nothing, and the node is unreachable with what ssh said to that (an unknown host
        key, a refused key).
  check_mode:
    details: It reads and reports; it writes its own cache of the torch probe
      (O(cache_seconds)), in check mode too, and makes the job's venv where O(venv) asks for
      one, not in check mode.
"""

EXAMPLES = r"""
- name: Gather node facts
  torchherd.cluster.node_facts:
    python: /opt/venv/bin/python
    root: /var/tmp/torchherd
    port: 29500
  register: facts
"""

RETURN = r"""
hostname:
  description: The node's host name.
  returned: always
  type: str
  sample: node0
euid:
  description: The effective user id the job runs as on the node (0 is root).
  returned: always
  type: int
  sample: 1000
root:
  description: torchherd's directory with C(~) expanded.
  returned: always
  type: str
  sample: /root/.torchherd
venv:
  description:
    - The job's locked venv where O(venv) was given, else null - C(path), C(python), C(key),
      C(made) (true where this call made it, false where it was reused), C(seconds) this call
      spent on it, C(uv) (its version), C(packages) (as C(uv pip freeze) lists them), or
      C(error) where it could not be made, C(missing) where check mode did not make it.
  returned: always
  type: dict
  sample: {path: /root/.torchherd/venvs/3f9a1c2e7b4d5a60, made: false, seconds: 0.001, uv: uv 0.13.9}
python:
  description: Path, version and executable of the job interpreter; C(error) when it does not run.
  returned: always
  type: dict
  sample: {path: /usr/bin/python3, version: 3.11.2, executable: /usr/bin/python3, error: null}
torch:
  description:
    - The torch build of the job interpreter; C(error) says why it could not be imported.
    - C(launchers) has the installed version of every launcher that torch does not bring
      (accelerate, deepspeed) for that interpreter, null where one is not installed.
    - C(gpus) are the GPUs the job sees (C(CUDA_VISIBLE_DEVICES) applied), each with C(index),
      C(uuid) (without the C(GPU-) prefix), C(name), C(memory_bytes), C(bus),
      C(persistence_mode) and C(compute_mode), C(compute_cap) (C(9.0)), C(mig_mode)
      (C(Enabled), C(Disabled)), C(ecc_uncorrected) (volatile uncorrected ECC errors),
      C(retired_pending) and C(remapped_pending) (retired pages or remapped rows waiting for a
      GPU reset) (null where their source does not say; from C(proc), all of these are null);
      C(gpus_from) says where they were read (C(nvidia-smi), C(proc), or C(torch), whose
      entries have the first four only) and C(driver) is the NVIDIA driver's version (null
      without one). C(gpu_count) is torch's count.
    - C(arch_list) is C(torch.cuda.get_arch_list()), the GPU architectures the build has kernels
      (C(sm_90)) or PTX (C(compute_90)) for; empty without CUDA.
  returned: always
  type: dict
  sample:
    version: 2.13.0+cu130
    cached: false
    cuda: "13.0"
    cuda_available: true
    gpu_count: 1
    gpus:
      - {index: 0, uuid: 5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d, name: NVIDIA H100 80GB HBM3,
         memory_bytes: 85520809984, bus: null, persistence_mode: true, compute_mode: Default,
         compute_cap: "9.0", mig_mode: Disabled, ecc_uncorrected: 0, retired_pending: null,
         remapped_pending: false}
    arch_list: [sm_75, sm_80, sm_86, sm_90, sm_100, sm_120]
    gpus_from: nvidia-smi
    driver: 570.124.06
    nccl: 2.28.9
    nccl_available: true
    launchers: {accelerate: 1.15.0, deepspeed: null}
    gloo_available: true
    error: null
code_current:
  description:
    - Whether the code in O(code_dir) is the controller's (RV(code_hash) equals O(code_expect)),
      so that the sync has nothing to send to this node; false where either is empty.
  returned: always
  type: bool
  sample: true
code_hash:
  description:
    - Content hash of O(code_files) in O(code_dir), computed as the controller computes its own,
      so that a relaunch with unchanged code can skip the sync; null when O(code_dir) is not
      there, a file is missing, or no files were given.
  returned: always
  type: str
  sample: 9f2c1e...
cuda_visible_devices:
  description: CUDA_VISIBLE_DEVICES of the node's environment, null when unset.
  returned: always
  type: str
  sample: "0,1"
addresses:
  description: IPv4 and IPv6 addresses by interface (loopback included).
  returned: always
  type: dict
  sample: {eth0: [10.66.101.10]}
interface:
  description:
    - The interface the job's traffic leaves this node on, for GLOO_SOCKET_IFNAME and
      NCCL_SOCKET_IFNAME, and its own address (the one the start's barrier connects from);
      null without O(master_addr).
    - C(how) says how it was chosen - C(explicit) (O(interface)), C(local) (the interface
      holding O(master_addr), so this node is the master), C(route) (the one the kernel's route to
      O(master_addr) leaves on) - and C(master) is the address O(master_addr) resolved to.
    - C(speed) is the link speed the kernel reports for it in Mb/s (the interconnect check's
      threshold may be a share of it); null where it reports none.
    - C(error) says why none could be chosen (no such interface, no address of the master's
      family on it, no route), with the node's interfaces or routes; null otherwise.
  returned: always
  type: dict
  sample: {name: data0, address: 10.67.101.11, how: route, master: 10.67.101.10, speed: 10000, error: null}
port_free:
  description: Whether O(port) can be bound on this node; null when not checked.
  returned: always
  type: bool
  sample: true
port_picked:
  description: With O(pick_port), a port free on every address of the node (the kernel's
    pick for port 0); null otherwise, or where none could be bound.
  returned: always
  type: int
  sample: 41873
disk_free_bytes:
  description: Free bytes on the file system holding O(root).
  returned: always
  type: int
  sample: 52428800000
py_spy:
  description: Path of py-spy next to the job's interpreter or on C(PATH) (what reads the ranks'
    stacks after a hang), null when missing.
  returned: always
  type: str
  sample: /opt/venv/bin/py-spy
rsync:
  description: Path of rsync on the node, null when missing.
  returned: always
  type: str
  sample: /usr/bin/rsync
running_jobs:
  description: Run directories of torchherd jobs with live processes on this node, with their
    pids (read before O(warm) starts its launcher).
  returned: always
  type: dict
  sample: {}
warm:
  description:
    - The launcher O(warm) started ahead - C(started), C(pid), C(deadline) - or why none was
      (C(started) false, C(error)); null without O(warm).
  returned: always
  type: dict
  sample: {started: true, pid: 4242, deadline: 60}
start:
  description:
    - With O(start), what the start did, as M(torchherd.cluster.torchrun_job)'s state=started
      returns it (C(started), C(pid), C(probe), C(record), ...), and C(received_at), the
      controller's time of the answer. C(started) false where the barrier called the start
      off; C(probe.refused) then names the nodes that refused, and C(probe.refused_here) why
      this node did.
  returned: with O(start), but in check mode
  type: dict
  sample: {started: true, pid: 4242, job_state: running}
gpu_processes:
  description:
    - The processes holding a GPU now (C(nvidia-smi --query-compute-apps)), each with
      C(gpu_uuid) (without C(GPU-)), C(pid), C(used_memory_bytes) and C(name); null where
      nvidia-smi is not there to say.
  returned: always
  type: list
  elements: dict
  sample: [{gpu_uuid: 5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d, pid: 4242, used_memory_bytes: 1048576000, name: python3}]
xid:
  description: The NVIDIA driver's Xid reports in the kernel log since boot (the last 20), from
    C(/dev/kmsg); null where the log cannot be read (no C(CAP_SYSLOG)) or there is no driver.
  returned: always
  type: list
  elements: str
  sample: ["NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus."]
boot_id:
  description: C(/proc/sys/kernel/random/boot_id); with the host name, how NCCL tells hosts apart.
  returned: always
  type: str
  sample: 2f1d3c4b-0a9e-4b8f-9d7c-6e5f4a3b2c1d
shm_bytes:
  description: The size of C(/dev/shm), null where there is none.
  returned: always
  type: int
  sample: 67108864
memlock:
  description: The locked-memory limit (C(ulimit -l)) the job inherits, in bytes, or C(unlimited).
  returned: always
  type: raw
  sample: unlimited
container:
  description:
    - The job's image on this node (only with O(container)) - C(runtime) and C(path) (null
      without one), C(image), C(id) (what the job runs, the image's id, null where it is not
      there; for apptainer the SIF file's path, with C(stamp), its size and time), C(pulled)
      (this call pulled it), C(seconds) (finding and pulling it) and C(error) (why the job
      cannot run in it here, else null).
    - C(start) says why the runtime could not start a container of the image, as the job's run
      will (its options and volumes, the job interpreter with an empty program), on every call,
      a cached torch probe or not - C(exit) (the runtime's exit code), C(said) (its error line),
      C(ulimits) (where the OCI runtime could not set a resource limit, the C(--ulimit) options
      at the node's hard limits that the run was tried again with) and C(started) (whether it
      started with them); null where it started, or where the image was not found.
  returned: always
  type: dict
  sample: {runtime: podman, path: /usr/bin/podman, image: "localhost/train:1", id: 746fcdc62655,
           pulled: false, seconds: 0.08, error: null, start: null}
infiniband:
  description: The InfiniBand/RoCE devices under C(/sys/class/infiniband), each port's C(state)
    and C(link_layer); empty without any.
  returned: always
  type: dict
  sample: {mlx5_0: {"1": {state: ACTIVE, link_layer: InfiniBand}}}
gpu_nics:
  description:
    - How far each GPU (by UUID, without C(GPU-)) is from each InfiniBand/RoCE device on the
      PCI tree, in the words of C(nvidia-smi topo -m) - C(PIX) (one PCIe switch), C(PXB)
      (several), C(PHB) (the same host bridge), C(NODE) (the same NUMA node), C(SYS) (across
      NUMA nodes) - read from C(/sys); empty without GPUs or devices.
  returned: always
  type: dict
  sample: {5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d: {mlx5_0: PIX, mlx5_1: SYS}}
"""

import os
import shutil
import socket
import sys
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import read_gpus, read_xids
from ansible_collections.torchherd.cluster.plugins.module_utils._hostfacts import host_facts
from ansible_collections.torchherd.cluster.plugins.module_utils._jobenv import (
    job_interpreter,
    made_venv,
    warm_launcher,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._netpath import (
    interfaces,
    select,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._nodefiles import (
    code_on_node,
    free_disk,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._ports import pick_free, port_free
from ansible_collections.torchherd.cluster.plugins.module_utils._relaunch import (
    changed as refusal,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    all_runs_with_processes,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._stacks import py_spy_path
from ansible_collections.torchherd.cluster.plugins.module_utils._starterror import StartError
from ansible_collections.torchherd.cluster.plugins.module_utils._torchprobe import NVIDIA_PROC

ARGUMENT_SPEC = dict(
    python=dict(type="path", default=""),
    root=dict(type="path", required=True),
    port=dict(type="int", default=0),
    pick_port=dict(type="bool", default=False),
    prefer_port=dict(type="int", default=0),
    probe_timeout=dict(type="float", default=60),
    cache_seconds=dict(type="int", default=0),
    code_dir=dict(type="path", default=""),
    code_files=dict(type="list", elements="str", default=[]),
    code_expect=dict(type="str", default=""),
    master_addr=dict(type="str", default=""),
    interface=dict(type="str", default=""),
    container=dict(type="dict", default={}, options=dict(
        image=dict(type="str"),
        runtime=dict(type="str", default="auto",
                     choices=["auto", "podman", "docker", "apptainer", "singularity"]),
        pull=dict(type="str", default="missing", choices=["missing", "always", "never"]),
        volumes=dict(type="list", elements="str", default=[]),
        options=dict(type="list", elements="str", default=[]),
    )),
    venv=dict(type="dict", default={}, options=dict(
        path=dict(type="path"),
        key=dict(type="str", no_log=False),
        lock=dict(type="str"),
        project=dict(type="str"),
        base_python=dict(type="path", default=""),
        index_url=dict(type="str", default="", no_log=True),
        find_links=dict(type="list", elements="str", default=[]),
        system_site_packages=dict(type="bool", default=False),
        uv=dict(type="path", default=""),
    )),
    warm=dict(type="dict", default={}, options=dict(
        run_id=dict(type="str"),
        module=dict(type="str", default="torch.distributed.run"),
        env=dict(type="dict", default={}),
        deadline=dict(type="float", default=60),
    )),
    # Spread into the other arguments by the action, which takes it out before the module runs.
    arguments=dict(type="dict", default={}),
    start=dict(type="dict"),
    start_expect=dict(type="dict", default={}),
    start_secret_env=dict(type="dict", default={}, no_log=True),
    # Read by the action, which adds its secret values as start_secret_env.
    secret_env_var=dict(type="str", no_log=False),
)


def gather(p, check_mode):
    """Every fact of the node, in the order they must be read: the venv before the interpreter
    in it, the running jobs before the warm launcher joins them."""
    python = p["python"] or sys.executable
    root = os.path.abspath(p["root"])
    venv = made_venv(p["venv"], root, check_mode) if (p["venv"] or {}).get("key") else None
    # Once per call, cached probe or not: who holds the GPUs and their health change any time.
    driver = read_gpus(NVIDIA_PROC)
    container, py, torch = job_interpreter(python, root, p["container"], p["probe_timeout"],
                                           p["cache_seconds"], driver, check_mode)
    ifaces = interfaces()
    code_hash = code_on_node(p["code_dir"], p["code_files"])
    running_jobs = all_runs_with_processes()
    warm = None
    if (p["warm"] or {}).get("run_id"):
        warm = warm_launcher(p["warm"], p["root"], python, py, torch, container, check_mode)
    return dict(
        hostname=socket.gethostname(),
        euid=os.geteuid(),
        root=root,
        venv=venv,
        container=container,
        python=py,
        torch=torch,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        addresses=ifaces,
        interface=select(p["master_addr"], p["interface"], ifaces) if p["master_addr"] else None,
        port_free=port_free(p["port"]) if p["port"] else None,
        port_picked=pick_free(prefer=p["prefer_port"]) if p["pick_port"] else None,
        disk_free_bytes=free_disk(root),
        rsync=shutil.which("rsync"),
        py_spy=py_spy_path(python),
        code_hash=code_hash,
        code_current=bool(code_hash) and code_hash == p["code_expect"],
        running_jobs=running_jobs,
        warm=warm,
        gpu_processes=(driver or {}).get("processes"),
        xid=read_xids() if driver else None,
        **host_facts((driver or {}).get("gpus"))
    )


def main():
    skip_last_collection()
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    try:
        facts = gather(p, module.check_mode)
    except OSError as exc:
        module.fail_json(msg=f"reading the node's facts: {exc}", exception=traceback.format_exc())
    changed = False
    if p["start"] and not module.check_mode:
        # Imported here: a facts call without a start compiles none of the start's code.
        from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.withfacts import (
            start_with_facts,
        )

        try:
            facts["start"] = start_with_facts(module, p["start"], p["start_secret_env"],
                                              refusal(facts, p["start_expect"]))
        except StartError as exc:  # after the barrier's go: the gate names the node
            module.fail_json(msg=f"the start that came with the facts call failed: {exc}",
                             **facts)
        changed = bool(facts["start"].get("changed"))
    module.exit_json(changed=changed, **facts)


if __name__ == "__main__":
    main()
