"""Ansible's own options on every action that talks to the nodes, with Ansible's meaning: the
SSH user and key, forks, become, the vault's passwords, the limit.

Each is given to ansible-playbook the way ansible-playbook's own flag would set it: the
configuration's environment variable (ANSIBLE_REMOTE_USER for -u, and so on), which also the
driver's own reads of the inventory and the job file see; a password asked for (-K, -J) is
typed once, kept in this process only, and answered to ansible-playbook's own prompt (never in
a file, an environment variable or a command line). The limit, which no configuration setting
holds, goes to ansible-playbook's own --limit, with localhost added: the plan and the summary
run there (see limit_pattern). A user's ansible.cfg sets the same things for every run; a flag
wins over it for this one, as with ansible-playbook.
"""

from __future__ import annotations

import argparse
import getpass
import os
from pathlib import Path
from typing import Any

from driver.result import UsageError

# flag -> (the configuration's environment variable, how its value is written)
_ENV = {
    "user": "ANSIBLE_REMOTE_USER",
    "private_key": "ANSIBLE_PRIVATE_KEY_FILE",
    "forks": "ANSIBLE_FORKS",
    "become_user": "ANSIBLE_BECOME_USER",
    "become_method": "ANSIBLE_BECOME_METHOD",
    "vault_password_file": "ANSIBLE_VAULT_PASSWORD_FILE",
}
# ansible-playbook's prompts (ansible-core's words) and the flag that makes it ask.
BECOME_PROMPT = r"BECOME password.*:\s*$"
VAULT_PROMPT = r"Vault password.*:\s*$"

# Passwords typed for this process: prompt pattern -> (ansible-playbook's flag, the password).
_answers: dict[str, tuple[str, str]] = {}
# ansible-playbook's --limit for this process's runs (limit_pattern), where -l was given.
_limit: list[str] = []
# The names by which a pattern means the controller itself (ansible-core's C.LOCALHOST).
_LOCALHOST = ("localhost", "127.0.0.1", "::1")


def add_arguments(parser: argparse.ArgumentParser, *, short_forks: bool = True) -> None:
    """Ansible's options, as ansible-playbook spells them (-f is --follow for logs)."""
    group = parser.add_argument_group(
        "Ansible options", "as ansible-playbook has them; they win over your ansible.cfg")
    group.add_argument("-u", "--user", metavar="REMOTE_USER",
                       help="connect as this user (the inventory's ansible_user wins over it)")
    group.add_argument("--private-key", "--key-file", dest="private_key", metavar="FILE",
                       help="use this file to authenticate the connection")
    group.add_argument(*(["-f"] if short_forks else []), "--forks", type=int, metavar="FORKS",
                       help="parallel connections (the schedule raises them where every node "
                            "must answer at once)")
    group.add_argument("-b", "--become", action="store_true", default=None,
                       help="run the tasks on the nodes with become (the job then runs as the "
                            "become user)")
    group.add_argument("--become-user", metavar="BECOME_USER",
                       help="the user to become (default root)")
    group.add_argument("--become-method", metavar="BECOME_METHOD",
                       help="the privilege escalation method (default sudo)")
    group.add_argument("-K", "--ask-become-pass", action="store_true",
                       help="ask for the become password (once; answered to Ansible's prompt)")
    group.add_argument("--vault-password-file", "--vault-pass-file", metavar="FILE",
                       help="the vault password file for a vaulted inventory or job file")
    group.add_argument("-J", "--ask-vault-pass", action="store_true",
                       help="ask for the vault password (once; answered to Ansible's prompt)")
    group.add_argument("-l", "--limit", metavar="SUBSET",
                       help="only the hosts this pattern matches (node1,node2; gpu:!node3; "
                            "@FILE); a launch that leaves out a node the job needs is refused "
                            "unless a spare takes its place")


def apply(args: argparse.Namespace, ask: Any = getpass.getpass) -> None:
    """Set what the flags given say, for this process and the ansible-playbook it runs; ask
    for the passwords wanted (``ask``: getpass, or a stand-in)."""
    for dest, variable in _ENV.items():
        value = getattr(args, dest, None)
        if value is not None:
            os.environ[variable] = str(value)
    if getattr(args, "become", None):
        os.environ["ANSIBLE_BECOME"] = "True"
    if getattr(args, "ask_become_pass", False):
        _answers[BECOME_PROMPT] = ("--ask-become-pass", ask("BECOME password: "))
    if getattr(args, "ask_vault_pass", False):
        _answers[VAULT_PROMPT] = ("--ask-vault-pass", ask("Vault password: "))
    if getattr(args, "limit", None) is not None:
        _limit[:] = ["--limit", limit_pattern(args.limit)]


def limit_pattern(given: str) -> str:
    """ansible-playbook's --limit for the pattern ``given``: its terms as Ansible splits them
    (those of a limit file, @FILE, read here as Ansible reads them), and localhost. The plays
    on the controller (the plan, the summary) run on localhost, which a limit that leaves it
    out would skip; the plan reads the limit (ansible_limit) and leaves out of the job what it
    does not match. Ansible takes a limit's terms as: the hosts named, then only those in each
    ``&`` term, less those in each ``!`` term. Localhost added survives every exclusion but its
    own and no intersection: those two are refused, not changed in meaning."""
    from ansible.inventory.manager import split_host_pattern

    terms: list[str] = []
    for term in split_host_pattern(given):
        if term.startswith("@"):
            try:
                lines = Path(term[1:]).expanduser().read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise UsageError(f"--limit {given}: expected a readable limit file {term[1:]}, "
                                 f"found {exc.strerror or exc}; fix: give the file's path "
                                 f"after @, or the hosts themselves") from None
            terms += [line.strip() for line in lines if line.strip()]
        elif term:
            terms.append(term)
    for term in terms:
        why = ("an intersection, which would leave localhost out" if term.startswith("&") else
               "localhost left out" if term[1:] in _LOCALHOST and term.startswith("!") else "")
        if why:
            raise UsageError(f"--limit {given}: expected a pattern that keeps localhost (the "
                             f"plan and the summary run there), found {term!r}, {why}; fix: "
                             f"name the hosts or groups to run on, less those to leave out "
                             f"(node1,node2 or gpu:!node3)")
    if not terms:
        raise UsageError(f"--limit {given!r}: expected a host pattern, found none; fix: name "
                         f"the hosts or groups to run on (node1,node2 or gpu:!node3)")
    if all(term.startswith("!") for term in terms):
        terms.insert(0, "all")  # Ansible's reading of exclusions alone: all hosts but those
    if not any(term in _LOCALHOST for term in terms):
        terms.append("localhost")
    return ",".join(terms)


def limit_flags() -> list[str]:
    """ansible-playbook's --limit and its pattern, where -l was given; else nothing."""
    return list(_limit)


def prompt_answers() -> tuple[list[str], dict[str, str]]:
    """ansible-playbook's flags that make it ask, and the answers to its prompts."""
    return ([flag for flag, _ in _answers.values()],
            {pattern: password for pattern, (_, password) in _answers.items()})


def passwords() -> list[str]:
    """The passwords typed, to be masked wherever they could show."""
    return [password for _, password in _answers.values() if password]


def vault_secrets() -> list[tuple[str, Any]]:
    """The vault secrets for this process's own reads (the inventory's job, the job file): the
    password typed (-J), then those of the configuration (vault_password_file, -J's file and
    vault_identity_list), as ansible-playbook would have them."""
    from ansible import constants
    from ansible.parsing.vault import VaultSecret

    found: list[tuple[str, Any]] = []
    if VAULT_PROMPT in _answers:
        found.append(("default", VaultSecret(_answers[VAULT_PROMPT][1].encode())))
    if constants.DEFAULT_VAULT_PASSWORD_FILE or constants.DEFAULT_VAULT_IDENTITY_LIST:
        from ansible.cli import CLI  # a tenth of a second: only where there is a vault
        from ansible.parsing.dataloader import DataLoader

        # vault_password_file is added by setup_vault_secrets itself.
        found += CLI.setup_vault_secrets(
            DataLoader(), constants.DEFAULT_VAULT_IDENTITY_LIST, vault_password_files=[],
            ask_vault_pass=False, auto_prompt=False, initialize_context=False)
    return found
