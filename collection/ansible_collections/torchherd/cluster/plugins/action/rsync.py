# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.rsync: rsync on the controller over Ansible's own SSH settings."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import tempfile
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_record import record

_ARGS = {
    "src": {"type": "str", "required": True},
    "dest": {"type": "str", "required": True},
    "direction": {"type": "str", "default": "push", "choices": ["push", "pull"]},
    "excludes": {"type": "list", "elements": "str", "default": []},
    "includes": {"type": "list", "elements": "str", "default": []},
    "only_included": {"type": "bool", "default": False},
    "delete": {"type": "bool", "default": False},
    "checksum": {"type": "bool", "default": False},
    "files": {"type": "list", "elements": "str", "default": []},
    "expect_hash": {"type": "str", "default": ""},
    "mark": {"type": "dict", "options": {"run_dir": {"type": "str", "required": True},
                                         "phase": {"type": "str", "required": True}}},
}


# From rsync --stats: the files sent, and the bytes that went over the wire (after the delta),
# to the node on a push, from it on a pull. Digits may be grouped (1,234 or 1.234).
_STATS_FILES = re.compile(r"^Number of regular files transferred: ([\d,.]+)", re.M)
_STATS_BYTES = {"push": re.compile(r"^Total bytes sent: ([\d,.]+)", re.M),
                "pull": re.compile(r"^Total bytes received: ([\d,.]+)", re.M)}


def _stat(pattern, out):
    found = pattern.search(out)
    return int(re.sub(r"\D", "", found.group(1))) if found else None


def outcome(stdout, direction):
    """The itemized changes, and the files and bytes transferred, of one rsync --stats run.
    The stats follow the changes; no change line starts like them (each starts with its item
    code)."""
    itemized = re.split(r"^Number of files: ", stdout, maxsplit=1, flags=re.M)[0]
    changes = [ln for ln in itemized.splitlines() if ln.strip()]
    return changes, _stat(_STATS_FILES, stdout), _stat(_STATS_BYTES[direction], stdout)


@functools.lru_cache(maxsize=1)
def _local_mkpath():
    """Whether the controller's rsync knows --mkpath (3.2.3 and later)."""
    try:
        out = subprocess.run(["rsync", "--version"], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return False
    found = re.search(r"version\s+(\d+)\.(\d+)\.(\d+)", out)
    return bool(found) and tuple(int(x) for x in found.groups()) >= (3, 2, 3)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _is_local(self):
        return self._connection.transport in ("local", "ansible.builtin.local")

    def _remote(self, path):
        """Turn a node path into rsync's remote form, or keep it local for local connections."""
        conn = self._connection
        if self._is_local():
            return path, None
        if conn.transport not in ("ssh", "ansible.builtin.ssh"):
            raise AnsibleActionFail(
                f"torchherd.cluster.rsync: connection '{conn.transport}' is not supported; "
                "use the ssh or local connection for the nodes")
        if conn.get_option("password"):
            raise AnsibleActionFail(
                "torchherd.cluster.rsync: password authentication cannot drive rsync; "
                "set up SSH keys for the nodes (ansible_ssh_private_key_file)")
        conn.host = conn.get_option("host") or self._play_context.remote_addr
        ssh = [to_text(a) for a in conn._build_command(conn.get_option("ssh_executable"), "ssh")]
        host = conn.host
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{path}", shlex.join(ssh)

    def _become_user(self):
        """The user the node's side of rsync runs as where the task is under become to another
        user than the SSH user (-b, --become-user), else None. rsync cannot answer a become
        prompt: sudo runs it non-interactively (-n), and where sudo asks for a password the
        copy fails with sudo's own words."""
        become = getattr(self._connection, "become", None)
        if become is None or self._is_local():
            return None
        user = self.get_become_option("become_user") or "root"
        if user == self._get_remote_user():
            return None
        if become.name not in ("sudo", "ansible.builtin.sudo"):
            raise AnsibleActionFail(
                f"torchherd.cluster.rsync: become method {become.name}: expected sudo, which "
                "can run rsync on the node as another user, found "
                f"{become.name}; fix: use --become-method sudo, or log in as {user} "
                "(ansible_user) so that no become is needed for the copy")
        return user

    def _push(self, argv, dest):
        """rsync creates only the last component of the destination. Try without a round trip
        first: --mkpath makes the parents (rsync 3.2.3 and later on both ends), and a relaunch
        finds them there anyway; only when that fails, make them over SSH and try again."""
        first = argv[:-2] + ["--mkpath"] + argv[-2:] if _local_mkpath() else argv
        proc = subprocess.run(first, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            return proc
        mk = self._low_level_execute_command(shlex.join(["mkdir", "-p", dest]))
        if mk["rc"] != 0:
            raise AnsibleActionFail(f"cannot create {dest} on the node: "
                                    f"{mk['stderr'].strip() or mk['stdout'].strip()}")
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=_ARGS)[1]
        if args["mark"]:
            # The phase that ends as the transfers begin (a launch's watch, as its collect
            # begins): the first node's records it, where a task of its own would cost the
            # controller a worker at the end of every launch.
            record(args["mark"]["run_dir"], {}, mark=args["mark"]["phase"],
                   check_mode=self._task.check_mode, once=True)
        # The node's side may start with ~ (the plan's default root is ~/.torchherd): rsync and
        # mkdir would take it literally, so it is resolved on the node first (one round trip,
        # only then). A local node's modules run in this process's environment and resolve ~
        # by its HOME; Ansible's own expansion would ask for the account's home instead (~user),
        # which differs where HOME is set otherwise, and the code would land where the job
        # never looks.
        side = "dest" if args["direction"] == "push" else "src"
        # Under become to another user, ~ is that user's home (as the modules resolve it).
        become_user = self._become_user()
        if args[side].startswith("~"):
            args[side] = (os.path.expanduser(args[side]) if self._is_local() else
                          self._remote_expand_user(args[side], sudoable=bool(become_user)))
        src = args["src"].rstrip("/") + "/"
        dest = args["dest"].rstrip("/") + "/"
        if args["direction"] == "push":
            src = os.path.abspath(os.path.expanduser(src)) + "/"
            if not os.path.isdir(src):
                raise AnsibleActionFail(f"torchherd.cluster.rsync: source directory {src} "
                                        "does not exist on the controller")
            dest, ssh = self._remote(dest)
        else:
            os.makedirs(os.path.expanduser(dest), exist_ok=True)
            src, ssh = self._remote(src)

        argv = ["rsync", "-rlptD", "--itemize-changes", "--out-format=%i %n%L", "--stats"]
        if ssh:
            argv += ["-e", ssh]
        if ssh and become_user:
            argv.append(f"--rsync-path=sudo -n -u {shlex.quote(become_user)} rsync")
        if args["checksum"]:
            argv.append("--checksum")
        if args["delete"]:
            argv.append("--delete")
        if self._task.check_mode:
            argv.append("--dry-run")
        listing = None
        if args["files"]:
            # Exactly the controller's manifest: what is hashed is what is sent.
            with tempfile.NamedTemporaryFile("w", prefix="torchherd-files-",
                                             delete=False) as listing:
                listing.write("\n".join(args["files"]) + "\n")
            argv.append(f"--files-from={listing.name}")
        argv += [f"--include={p}" for p in args["includes"]]
        if args["only_included"]:
            argv += ["--include=*/", "--exclude=*", "--prune-empty-dirs"]
        argv += [f"--exclude={p}" for p in args["excludes"]]
        argv += [src, dest]
        if args["direction"] == "push" and not ssh:
            os.makedirs(dest, exist_ok=True)
        try:
            if args["direction"] == "push" and ssh:
                proc = self._push(argv, args["dest"])
            else:
                proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        finally:
            if listing:
                os.unlink(listing.name)
        shown = argv if not ssh else argv[:argv.index("-e")] + argv[argv.index("-e") + 2:]
        if proc.returncode != 0:
            # A failed result, not an exception: ansible-core applies a task's failed_when
            # only to results (collect tolerates a node without the run's directory, which
            # a launch cancelled before its start leaves).
            result.update(failed=True, cmd=shown, rc=proc.returncode,
                          msg=f"rsync {args['direction']} failed (exit {proc.returncode}): "
                              f"{proc.stderr.strip()[-2000:]}; fix: "
                              + (f"check that {args['dest']} on the node is writable by the "
                                 "SSH user and has free disk (the file rsync names above)"
                                 if args["direction"] == "push" else
                                 f"check that {args['src']} on the node is readable by the SSH "
                                 f"user and {args['dest']} here writable"))
            return result
        changes, files, sent = outcome(proc.stdout, args["direction"])
        result.update(changed=bool(changes), changes=changes[:200], count=len(changes), cmd=shown,
                      transferred_files=files, transferred_bytes=sent)
        if args["expect_hash"] and not self._task.check_mode:
            remote = self._execute_module(
                module_name="torchherd.cluster.code_hash",
                module_args={"path": args["dest"], "files": args["files"]},
                task_vars=task_vars)
            result["hash"] = remote.get("hash")
            if remote.get("failed") or remote.get("hash") != args["expect_hash"]:
                missing = remote.get("missing") or []
                raise AnsibleActionFail(
                    f"code on the node differs from the controller's after the sync: expected "
                    f"hash {args['expect_hash'][:12]}, found {str(remote.get('hash'))[:12]}"
                    + (f" ({len(missing)} file(s) missing, e.g. {missing[0]})" if missing else "")
                    + f" {remote.get('msg', '')}; fix: check free disk and permissions at "
                    f"{args['dest']}", result=result)
        # When the node's copy was done, on the controller's clock: the last node's is the
        # end of the sync phase (summary.json's timings).
        result["ended_at"] = round(time.time(), 3)
        return result
