# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node's NVIDIA GPUs as the driver lists them, read without CUDA: nvidia-smi's query, else
the driver's files under /proc. Asking torch instead initializes CUDA in the job's interpreter
(seconds per node and launch); these take milliseconds. Runs on the nodes (Python 3.8 and later).

Each GPU: index (as CUDA numbers the visible ones; in PCI order where a node's GPUs are of
other models, which CUDA orders by speed), uuid (without nvidia-smi's C(GPU-) prefix, as torch
gives it), name, memory_bytes, persistence_mode and compute_mode (None from /proc, which does not
say them), bus (the PCI address as the source gives it), and what preflight judges the GPU's health
by (see HEALTH): compute_cap, mig_mode, ecc_uncorrected, retired_pending, remapped_pending (None
where the source or the GPU does not say).
"""

from __future__ import annotations

import csv
import errno
import os
import re
import shutil
import subprocess

SMI_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "persistence_mode",
              "compute_mode")
# The GPU's health, by the key each GPU carries: a driver older than one of these fields refuses
# the whole query, which is then asked again without them (SMI_BASE_ARGS).
HEALTH = (("compute_cap", "compute_cap"), ("mig_mode", "mig.mode.current"),
          ("ecc_uncorrected", "ecc.errors.uncorrected.volatile.total"),
          ("retired_pending", "retired_pages.pending"),
          ("remapped_pending", "remapped_rows.pending"))
_FORMAT = "--format=csv,noheader,nounits"
# Last in both queries: where the GPU sits on the PCI tree (which NICs are near it).
BUS = ("pci.bus_id",)
SMI_ARGS = ["--query-gpu=" + ",".join(SMI_FIELDS + tuple(field for _key, field in HEALTH) + BUS),
            _FORMAT]
SMI_BASE_ARGS = ["--query-gpu=" + ",".join(SMI_FIELDS + BUS), _FORMAT]
# The fields of an answer by its length: both queries, with or without the bus (as recorded
# from a version of this module that did not ask for it).
_ANSWERS = {len(fields): fields for fields in (
    SMI_FIELDS, SMI_FIELDS + BUS, SMI_FIELDS + tuple(field for _key, field in HEALTH),
    SMI_FIELDS + tuple(field for _key, field in HEALTH) + BUS)}
# Processes holding a GPU (another user's, a stale job's); process_name last, as it may hold
# commas that nvidia-smi does not quote.
APPS_ARGS = ["--query-compute-apps=gpu_uuid,pid,used_memory,process_name", _FORMAT]
# nvidia-smi initializes the driver where no persistence daemon keeps it: about a second per GPU
# at worst, and a hung GPU must not hang preflight.
SMI_TIMEOUT = 15


def _uuid(text):
    text = text.strip()
    return text[4:] if text.startswith("GPU-") else text


def _known(text):
    """None for nvidia-smi's [N/A] and [Not Supported]."""
    text = text.strip()
    return None if not text or text.startswith("[") else text


def parse_smi(text):
    """(GPUs, driver version) from nvidia-smi's CSV answer to SMI_ARGS; ValueError where a line
    is not one."""
    gpus, driver = [], None
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row:
            continue
        if len(row) not in _ANSWERS or not row[0].strip().isdigit():
            raise ValueError(f"not a GPU of nvidia-smi's query: {','.join(row)!r}")
        values = dict(zip(_ANSWERS[len(row)], (field.strip() for field in row)))
        memory = _known(values["memory.total"])
        persistence = _known(values["persistence_mode"])
        health = {key: _known(values.get(field, "")) for key, field in HEALTH}
        ecc = health["ecc_uncorrected"]
        health["ecc_uncorrected"] = int(ecc) if ecc and ecc.isdigit() else None
        for key in ("retired_pending", "remapped_pending"):
            health[key] = None if health[key] is None else health[key] == "Yes"
        gpus.append({"index": int(values["index"]), "uuid": _uuid(values["uuid"]),
                     "name": values["name"],
                     "memory_bytes": int(memory) * 1024 * 1024 if memory
                     and memory.isdigit() else None,
                     "bus": _known(values.get("pci.bus_id", "")),
                     "persistence_mode": None if persistence is None
                     else persistence == "Enabled",
                     "compute_mode": _known(values["compute_mode"]), **health})
        driver = driver or _known(values["driver_version"])
    return gpus, driver


def parse_apps(text):
    """The processes of nvidia-smi's answer to APPS_ARGS: gpu_uuid (without C(GPU-)), pid,
    used_memory_bytes (None where it does not say, as in a container), name."""
    found = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",", 3)]
        if len(parts) < 3 or not parts[1].isdigit():
            continue  # "No running processes found" from older drivers
        memory = _known(parts[2])
        found.append({"gpu_uuid": _uuid(parts[0]), "pid": int(parts[1]),
                      "used_memory_bytes": int(memory) * 1024 * 1024 if memory
                      and memory.isdigit() else None,
                      "name": parts[3] if len(parts) > 3 else None})
    return found


def xid_lines(records):
    """The kernel log's Xid reports (NVRM: Xid ...) among `records` (/dev/kmsg's, each
    "prio,seq,usec,flags;text"), their text only."""
    found = []
    for record in records:
        text = record.partition(";")[2] if ";" in record else record
        if "NVRM: Xid" in text:
            found.append(text.strip())
    return found


def read_xids(path="/dev/kmsg", limit=20):
    """The last `limit` Xid reports the kernel logged since boot (as far as its ring buffer
    goes); None where the log cannot be read (no CAP_SYSLOG with dmesg_restrict, a container
    without /dev/kmsg)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the log so far
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # a record overwritten while reading: go on with the next
                return None
            if not chunk:
                break
            # One record a read from /dev/kmsg (its continuation lines start with a space).
            text = chunk.decode("utf-8", errors="replace")
            if "NVRM: Xid" in text:
                records.extend(text.splitlines())
    finally:
        os.close(fd)
    return xid_lines(records)[-limit:]


def parse_information(text):
    """The fields of one GPU's /proc/driver/nvidia/gpus/<bus>/information file."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def parse_proc(files):
    """GPUs from {bus: content of its information file}, in PCI order (nvidia-smi's, and CUDA's
    with CUDA_DEVICE_ORDER=PCI_BUS_ID); a GPU the driver excludes is none CUDA can use."""
    gpus = []
    for bus in sorted(files):
        fields = parse_information(files[bus] or "")
        if fields.get("GPU Excluded", "No").lower().startswith("y"):
            continue
        gpus.append(dict({"index": len(gpus), "uuid": _uuid(fields.get("GPU UUID", "")),
                          "name": fields.get("Model"), "memory_bytes": None,
                          "bus": (fields.get("Bus Location") or bus).lower(),
                          "persistence_mode": None, "compute_mode": None},
                         **dict.fromkeys(key for key, _field in HEALTH)))
    return gpus


def gpu_files(proc):
    """{bus: information file content or None} of every GPU the driver lists under `proc` (its
    directory, /proc/driver/nvidia); None where the driver is not loaded."""
    gpus_dir = os.path.join(proc, "gpus")
    if not os.path.isdir(gpus_dir):
        return None
    found = {}
    for bus in os.listdir(gpus_dir):
        try:
            with open(os.path.join(gpus_dir, bus, "information"), encoding="utf-8",
                      errors="replace") as handle:
                found[bus] = handle.read()
        except OSError:
            found[bus] = None
    return found


def driver_version(proc):
    """The kernel module's version from `proc`/version, or None."""
    try:
        with open(os.path.join(proc, "version"), encoding="utf-8",
                  errors="replace") as handle:
            match = re.search(r"Kernel Module(?: for \S+)?\s+(\d[\w.-]*)", handle.read())
    except OSError:
        return None
    return match.group(1) if match else None


def read_gpus(proc, smi=None, timeout=SMI_TIMEOUT):
    """{gpus, driver, source} of this node without CUDA (all of them, CUDA_VISIBLE_DEVICES not
    applied), from nvidia-smi (`smi`, else the one on PATH), else from the driver's directory
    `proc`; None where neither tells."""
    smi = smi if smi is not None else shutil.which("nvidia-smi")
    if smi:
        try:
            return dict(_ask_smi(smi, timeout), source="nvidia-smi")
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass  # the driver's files may still tell
    files = gpu_files(proc)
    if files is None:
        return None
    return {"gpus": parse_proc(files), "driver": driver_version(proc), "source": "proc",
            "processes": None}


def _ask_smi(smi, timeout):
    """{gpus, driver, processes} from nvidia-smi: the GPU query and the processes' at once (two
    processes side by side: nvidia-smi answers one query a call); ValueError where it fails."""
    apps = subprocess.Popen([smi] + APPS_ARGS, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        answer = subprocess.run([smi] + SMI_ARGS, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if answer.returncode != 0:
            answer = subprocess.run([smi] + SMI_BASE_ARGS, capture_output=True, text=True,
                                    timeout=timeout, check=False)
        if answer.returncode != 0:
            raise ValueError(answer.stderr.strip() or answer.stdout.strip())
        gpus, driver = parse_smi(answer.stdout)
        try:
            out = apps.communicate(timeout=timeout)[0]
            processes = parse_apps(out) if apps.returncode == 0 else None
        except subprocess.TimeoutExpired:
            processes = None
    finally:
        if apps.poll() is None:
            apps.kill()
            apps.wait()
    return {"gpus": gpus, "driver": driver, "processes": processes}


def visible(gpus, cuda_visible_devices, device_order=None):
    """The GPUs CUDA shows a process with this CUDA_VISIBLE_DEVICES, numbered as it numbers
    them; None where which GPUs those are cannot be told without CUDA (MIG instances, a
    duplicate, or indices among GPUs of other models, which CUDA orders by speed unless
    CUDA_DEVICE_ORDER is PCI_BUS_ID).

    As CUDA reads the variable: unset shows all; entries are indices or UUIDs (a unique prefix
    will do) and the list ends at the first entry that names no GPU."""
    ordered = sorted(gpus, key=lambda gpu: gpu["index"])
    by_speed = device_order != "PCI_BUS_ID" and len({gpu["name"] for gpu in gpus}) > 1
    if cuda_visible_devices is None:
        chosen = ordered
    else:
        chosen = []
        for entry in (e.strip() for e in cuda_visible_devices.split(",")):
            if entry.startswith("MIG-"):
                return None
            if entry.isdigit():
                if by_speed:
                    return None
                found = [ordered[int(entry)]] if int(entry) < len(ordered) else []
            elif entry.startswith("GPU-"):
                found = [g for g in ordered if ("GPU-" + g["uuid"]).startswith(entry)]
            else:
                found = []
            if len(found) != 1:
                break
            if found[0] in chosen:
                return None
            chosen.append(found[0])
    return [dict(gpu, index=i) for i, gpu in enumerate(chosen)]
