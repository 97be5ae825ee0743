# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the plan reads of a host in the inventory: its variables, its address, and its own
settings, coerced as Ansible coerces its options."""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean


def host_vars(name, hostvars):
    """The node's variables; read through the hostvars mapping, which templates on access."""
    # Not hostvars.get(): Ansible's hostvars answers an unknown host with an undefined marker.
    return hostvars[name] if name in hostvars else {}  # noqa: SIM401


def address(hv, name):
    for key in ("torchherd_address", "ansible_host"):
        value = hv.get(key)
        if value:
            return str(value)
    return str(name)


def nproc(value):
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


def host_setting(name, hv, key, default, coerce, problems):
    """A host's own setting of a variable, coerced as Ansible coerces its options: an INI
    inventory gives every value as a string ("false", "1", "50000-50999")."""
    if hv.get(key) is None:
        return default
    try:
        return coerce(hv[key])
    except TypeError as exc:
        problems.append(f"host {name}: {key}: {exc}; fix: correct it in the inventory")
        return default


def every_host_allows(names, hvs, key, problems):
    """Whether no host turns off a switch of the whole launch (``key``, default on). Every
    host's setting is read, so that each bad one is named."""
    return False not in [host_setting(h, hvs[h], key, True, boolean, problems) for h in names]
