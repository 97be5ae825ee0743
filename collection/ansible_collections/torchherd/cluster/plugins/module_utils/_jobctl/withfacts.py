# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A relaunch's start in its facts call: node_facts hands the start's arguments (torchrun_job's,
checked against that module's own spec) and why the node must not start, if it must not
(_relaunch), to the start of torchrun_job's state=started. Runs on the nodes (Python 3.8 and
later)."""

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.spec import ARGUMENT_SPEC
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import run_paths
from ansible_collections.torchherd.cluster.plugins.module_utils._starterror import StartError


def start_with_facts(module, args, secret_env, refuse):
    """The start's result fields (``started`` false where the barrier called it off, this node's
    refusal among the reasons); ``refuse``: why this node must not start, or None. Raises
    StartError where the start failed after the barrier's go."""
    # Imported here: a facts call without a start compiles none of the start's code.
    from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import FirewallError
    from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.start import start

    checked = ArgumentSpecValidator(ARGUMENT_SPEC).validate(
        dict(args, state="started", secret_env=dict(secret_env or {})))
    if checked.error_messages:
        module.fail_json(msg="start: " + "; ".join(checked.error_messages))
    p = checked.validated_parameters
    try:
        return start(module, p, run_paths(p["root"], p["run_id"]), with_facts={"refuse": refuse})
    except FirewallError as exc:  # the rules the start opened could not be removed again
        raise StartError(exc.msg) from exc
