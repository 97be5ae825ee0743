# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The torchrun_job module's arguments (its DOCUMENTATION says what each is): the module's own
spec, and the one a relaunch's start made in node_facts' call is checked against, so that the
start's arguments are the same either way. Runs on the nodes (Python 3.8 and later)."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import RULE_OPTIONS
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS

ARGUMENT_SPEC = dict(
    state=dict(type="str", default="status",
               choices=["started", "status", "waiting", "stopped"]),
    run_id=dict(type="str", required=True),
    restart=dict(type="int", default=0),
    root=dict(type="path", required=True),
    python=dict(type="path", default=""),
    launcher=dict(type="str", default="torchrun",
                  choices=list(LAUNCHERS)),
    launcher_args=dict(type="list", elements="str", default=[]),
    use_cpu=dict(type="bool", default=False),
    torch_version=dict(type="str", default=""),
    script=dict(type="str"),
    args=dict(type="list", elements="str", default=[]),
    chdir=dict(type="path"),
    nnodes=dict(type="str", default="1"),
    nproc_per_node=dict(type="int", default=1),
    node_nprocs=dict(type="list", elements="int", default=[]),
    node_rank=dict(type="int", default=0),
    master_addr=dict(type="str", default="127.0.0.1"),
    master_port=dict(type="int", default=29500),
    rdzv=dict(type="str", default="static", choices=["static", "c10d"]),
    max_restarts=dict(type="int", default=0),
    rdzv_conf=dict(type="dict", default={}),
    env=dict(type="dict", default={}),
    secret_env=dict(type="dict", default={}, no_log=True),
    # Used by the action (plugins/action/torchrun_job.py), which takes it out of the
    # arguments before the module runs. A variable's name, not a secret.
    secret_env_var=dict(type="str", no_log=False),
    # Spread into the other arguments by the action, which takes it out before the
    # module runs.
    arguments=dict(type="dict", default={}),
    timeout=dict(type="int", default=0),
    wait_timeout=dict(type="float", default=5),
    grace=dict(type="float", default=10),
    sample_every=dict(type="float", default=0),
    meta=dict(type="dict", default={}),
    wrapper=dict(type="list", elements="str", default=[]),
    warm=dict(type="bool", default=False),
    standby=dict(type="dict", options=dict(
        delay=dict(type="float", default=0),
    )),
    container=dict(type="dict", options=dict(
        runtime=dict(type="str", required=True,
                     choices=["podman", "docker", "apptainer", "singularity"]),
        path=dict(type="path", required=True),
        image=dict(type="str", required=True),
        id=dict(type="str", default=""),
        gpus=dict(type="bool", default=False),
        volumes=dict(type="list", elements="str", default=[]),
        options=dict(type="list", elements="str", default=[]),
    )),
    barrier=dict(type="dict", options=dict(
        listen=dict(type="bool", default=False),
        expect=dict(type="int", default=1),
        timeout=dict(type="float", default=3),
        window=dict(type="float", default=20),
        source=dict(type="str", default=""),
        background=dict(type="bool", default=False),
    )),
    firewall=dict(type="dict", options=dict(RULE_OPTIONS)),
    gang=dict(type="bool", default=False),
    lines=dict(type="float", default=0),
    hang=dict(type="dict", options=dict(
        timeout=dict(type="float", required=True),
        quiet_since=dict(type="float", default=0),
    )),
)
