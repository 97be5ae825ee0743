# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The options of node_facts, documented apart from the module so that the module stays its
argument spec and its calls.

Private to the collection (leading underscore): free to change. Used by node_facts alone.
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  python:
    description:
      - Interpreter of the job; empty means the one running this module. C(~) is the node
        user's home.
      - With O(venv), the venv's interpreter (the plan's C(<root>/venvs/<key>/bin/python)).
    type: path
    default: ""
  root:
    description: torchherd's directory on the node (runs and code live under it).
    type: path
    required: true
  port:
    description: Port to check for being free (the master port); 0 skips the check.
    type: int
    default: 0
  pick_port:
    description:
      - Pick a free port (the master port of a job whose C(master_port) is C(auto)), returned
        as RV(port_picked).
    type: bool
    default: false
  prefer_port:
    description:
      - With O(pick_port), the port picked where it is free (a relaunch whose start comes with
        this call keeps the master port its starts were computed for); 0 lets the kernel pick.
    type: int
    default: 0
  probe_timeout:
    description: Seconds allowed for importing torch in the job interpreter.
    type: float
    default: 60
  cache_seconds:
    description:
      - Reuse the last successful torch probe of this interpreter for this long; 0 probes every time.
      - Importing torch costs seconds of CPU on every node and launch. The cached answer is used
        only while everything it depends on is unchanged - the interpreter, the torch install
        (its files' times), C(LD_LIBRARY_PATH), C(CUDA_VISIBLE_DEVICES), C(CUDA_DEVICE_ORDER),
        the NVIDIA driver version and the GPUs the driver lists (model, UUID, bus) - so a
        reinstall, a driver update or a GPU gone missing probes again. The GPUs' state (modes,
        ECC and page counts) and the processes holding them are read on every call.
      - Stored in C(<root>/.torch-probe.json).
    type: int
    default: 0
  code_dir:
    description:
      - Where the job's code lives on the node (the sync's destination); with O(code_files),
        the module hashes the code already there (see RV(code_hash)).
    type: path
    default: ""
  code_files:
    description: The files of the job's code (the controller's manifest) to hash in O(code_dir).
    type: list
    elements: str
    default: []
  code_expect:
    description:
      - The controller's hash of the job's code; RV(code_current) says whether the code in
        O(code_dir) is that. Empty compares nothing.
    type: str
    default: ""
  master_addr:
    description:
      - The master's address (or name) as the job reaches it; with it, the module chooses the
        interface the job's traffic uses on this node (see RV(interface)). Empty skips that.
    type: str
    default: ""
  interface:
    description:
      - The interface the user named for this node; empty lets the route to O(master_addr)
        decide.
    type: str
    default: ""
  container:
    description:
      - The job's container image. The runtime is found (O(container.runtime)), the image
        looked for and pulled where O(container.pull) says so (see RV(container)), and the
        interpreter's and torch's facts are read inside the image (O(python) is the image's -
        C(python3) finds it on the image's C(PATH)), with the node's GPUs given to it, the host's
        network and IPC, and the job's O(container.volumes) and O(container.options). The cached
        answer is kept while the image's id is the same.
      - An image that cannot be had is no failure of the module; C(error) in RV(container) says
        why, and no interpreter is probed. In check mode nothing is pulled.
      - Empty (the default) runs on the node itself.
    type: dict
    default: {}
    suboptions:
      image:
        description: The image, as the runtime names it (C(nvcr.io/nvidia/pytorch:25.01-py3)).
        type: str
      runtime:
        description:
          - The runtime; C(auto) takes the first of podman, docker, apptainer and singularity on
            C(PATH).
          - apptainer (and singularity) run a SIF file or sandbox directory on the node
            (O(container.image) its path), or pull an image given as a C(docker://), C(oras://)
            or C(library://) URI into a SIF file under O(root)C(/images).
        type: str
        default: auto
        choices: [auto, podman, docker, apptainer, singularity]
      pull:
        description:
          - C(missing) pulls the image where the node lacks it, C(always) on every launch (a
            moving tag), C(never) refuses a node without it.
        type: str
        default: missing
        choices: [missing, always, never]
      volumes:
        description: The job's own volumes, in the runtime's C(--volume) syntax.
        type: list
        elements: str
        default: []
      options:
        description: The job's own options of the runtime's C(run) (C(--shm-size=16g)).
        type: list
        elements: str
        default: []
  venv:
    description:
      - The job's locked venv. Before anything else, the module makes it with uv at O(venv.path)
        from O(venv.lock), or reuses it where the same O(venv.key) made it before (see
        RV(venv)); O(python) is then its interpreter. Empty (the default) makes none.
      - uv is the one named, else on C(PATH), in C(~/.local/bin), C(<root>/tools/uv), or
        C(<base_python> -m uv); without one it is installed with pip into C(<root>/tools/uv)
        from the same index or wheelhouse. uv's cache is C(<root>/cache/uv).
      - A venv that cannot be made is no failure of the module; C(error) in RV(venv) says why. In
        check mode, a venv that is not there yet is not made (C(missing) in RV(venv)).
    type: dict
    default: {}
    suboptions:
      path:
        description: The venv's directory.
        type: path
      key:
        description:
          - The plan's hash of the lock, of O(venv.system_site_packages) and of the base
            interpreter; the venv there is reused while it is the same.
        type: str
      lock:
        description:
          - The lock's text, a requirements file whose every requirement is pinned, or uv's
            lock (with O(venv.project)).
        type: str
      project:
        description:
          - The text of the C(pyproject.toml) beside uv's lock (C(uv.lock)); uv exports the lock
            to pinned requirements first.
        type: str
      base_python:
        description: The interpreter the venv is made from; empty means the one running this module.
        type: path
        default: ""
      index_url:
        description: The package index to install from; empty means uv's default.
        type: str
        default: ""
      find_links:
        description:
          - Wheelhouses (directories on the node or URLs); without O(venv.index_url), no index is
            used.
        type: list
        elements: str
        default: []
      system_site_packages:
        description: Whether the venv sees the base interpreter's packages too.
        type: bool
        default: false
      uv:
        description: The uv to run; empty finds one.
        type: path
        default: ""
  warm:
    description:
      - The job's launcher started ahead, where the schedule says so (its C(start.warm)); at
        the end of this call, the job's interpreter (O(python)) starts in the background,
        imports O(warm.module) and waits up to O(warm.deadline) seconds for the start of run
        O(warm.run_id), which hands it the launcher's command line
        (M(torchherd.cluster.torchrun_job)'s O(torchherd.cluster.torchrun_job#module:warm)).
        Its imports (torch) then happen while the launch is still in preflight.
      - It carries the run's marker (a stop of the run id ends it), and ends by itself at the
        deadline where no start came (a launch that failed before its start).
      - Not started in check mode, in the job's image (O(container)), where the interpreter or
        torch could not be read, or where the run id is already on this node.
      - Empty (the default) starts none.
    type: dict
    default: {}
    suboptions:
      run_id:
        description: The run it waits for.
        type: str
      module:
        description: The launcher's module (run with C(-m)), imported ahead.
        type: str
        default: torch.distributed.run
      env:
        description: The job's variables (not its secrets), in its environment from the start
          (a few are read at import).
        type: dict
        default: {}
      deadline:
        description: Seconds it waits for the start.
        type: float
        default: 60
  start:
    description:
      - A relaunch's start in this call, M(torchherd.cluster.torchrun_job)'s arguments for
        O(torchherd.cluster.torchrun_job#module:state=started), as the controller computed them
        from the last launch's preflight of the same job on the same nodes (the schedule's
        C(start.with_facts)). Checked against that module's own argument spec.
      - Once the facts are read (and the launcher started ahead, O(warm)), the node compares
        them with O(start_expect) and goes to the start's barrier either way; it refuses there
        where they differ (or where the start could not get that far), and the master then
        calls the start off on every node (RV(start)). Nothing of a start called off stays; the
        rules it opened go again; the launcher started ahead stays for the next start.
      - Not in check mode. Null (the default) starts nothing.
    type: dict
  start_expect:
    description:
      - What the facts must be for O(start) to go on here - C(facts), the fingerprint of each
        fact the last launch's gate judged (by name), C(min_free_bytes), the gate's floor of
        free disk at O(root) - and the code the controller's (RV(code_current)).
    type: dict
    default: {}
  start_secret_env:
    description: The job's secret variables for O(start), added by the action from
      O(secret_env_var); never logged.
    type: dict
    default: {}
  secret_env_var:
    description: The variable that holds the job (with its C(secret_env)), read by the action
      on the controller for O(start); the module itself ignores it.
    type: str
"""
