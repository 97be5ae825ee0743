"""The cached torch probe: reused only while nothing it depends on changed."""

import json
import os
import shutil
import sys

import pytest
from nvidia_proc import INFORMATION, driver_dir

from ansible_collections.torchherd.cluster.plugins.module_utils import _jobenv, _torchprobe

GOOD = ({"path": sys.executable, "version": "3.11.2"},
        {"version": "2.13.0+cpu", "cuda": None, "error": None})


@pytest.fixture
def probes(monkeypatch):
    calls = []

    def fake(python, timeout, nvml=False, prefix=()):
        calls.append(python if not prefix else (python, tuple(prefix)))
        return GOOD[0], dict(GOOD[1])

    monkeypatch.setattr(_torchprobe, "probe_torch", fake)
    return calls


def test_second_probe_comes_from_the_cache(tmp_path, probes):
    _, first = _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    _, second = _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["version"] == "2.13.0+cpu"
    assert len(probes) == 1


def test_zero_seconds_probes_every_time_and_writes_nothing(tmp_path, probes):
    for _ in range(2):
        assert _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 0)[1]["cached"] is False
    assert len(probes) == 2
    assert not (tmp_path / ".torch-probe.json").exists()


@pytest.mark.parametrize("var", ["LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"])
def test_a_changed_environment_probes_again(tmp_path, probes, monkeypatch, var):
    _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    monkeypatch.setenv(var, "/elsewhere" if var == "LD_LIBRARY_PATH" else "1")
    assert _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False
    assert len(probes) == 2


def test_a_changed_torch_install_probes_again(tmp_path, probes):
    _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    cache = tmp_path / ".torch-probe.json"
    entries = json.loads(cache.read_text())
    # What a reinstall looks like to the fingerprint: other times on torch's files.
    for entry in entries.values():
        entry["key"]["interpreter"][3][1][1] += 1
    cache.write_text(json.dumps(entries))
    assert _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False


def test_an_expired_or_failed_probe_is_not_reused(tmp_path, probes, monkeypatch):
    _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    cache = tmp_path / ".torch-probe.json"
    entries = json.loads(cache.read_text())
    for entry in entries.values():
        entry["at"] -= 7200
    cache.write_text(json.dumps(entries))
    assert _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False
    cache.unlink()
    monkeypatch.setattr(_torchprobe, "probe_torch", lambda python, timeout, nvml=False, prefix=(): (
        GOOD[0], {"version": None, "error": "ModuleNotFoundError: No module named 'torch'"}))
    _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    assert not cache.exists()


def test_a_corrupt_cache_file_is_ignored(tmp_path, probes):
    (tmp_path / ".torch-probe.json").write_text("{not json")
    assert _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False
    assert _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is True


def test_the_fingerprint_in_process_is_the_one_of_a_subprocess(tmp_path):
    """The module's own interpreter is fingerprinted in its process; the same interpreter under
    another spelling of its path runs in a subprocess and gives the same key, so the cache
    holds either way. (Not a link elsewhere: a venv's python away from its pyvenv.cfg is the
    base interpreter, with other packages.)"""
    other = os.path.join(os.path.dirname(sys.executable), ".", os.path.basename(sys.executable))
    here = _torchprobe.fingerprint(sys.executable, 30)
    there = _torchprobe.fingerprint(other, 30)
    assert here is not None and there is not None
    assert here == there
    assert here["interpreter"][2] == there["interpreter"][2]  # torch's spec origin
    # A python that is not there cannot be fingerprinted, so the probe runs uncached.
    assert _torchprobe.fingerprint(str(tmp_path / "missing"), 30) is None


def test_a_node_with_an_nvidia_driver_hits_the_cache(tmp_path, probes, monkeypatch):
    """The real fingerprint on a recorded driver (its GPUs' information files), stored in the
    cache and read back (JSON: lists, never tuples), equals a fresh one: a hit. Another GPU or
    another torch is a miss."""
    monkeypatch.setattr(_torchprobe, "NVIDIA_PROC",
                        driver_dir(tmp_path, {"0000:18:00.0": INFORMATION}))
    # Another spelling of this interpreter: the fingerprint runs in a subprocess, which finds
    # the torch on PYTHONPATH, a stand-in whose files can change as a reinstall changes them.
    python = os.path.join(os.path.dirname(sys.executable), ".", os.path.basename(sys.executable))
    torch = tmp_path / "site" / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text("")
    (torch / "version.py").write_text("__version__ = '2.13.0+cu130'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    root = tmp_path / "root"
    _, first = _torchprobe.cached_probe(python, 30, str(root), 3600)
    _, second = _torchprobe.cached_probe(python, 30, str(root), 3600)
    assert (first["cached"], second["cached"]) == (False, True)
    assert len(probes) == 1
    stored, = json.loads((root / ".torch-probe.json").read_text()).values()
    assert stored["key"]["gpus"] == [["0000:18:00.0", INFORMATION]]
    assert stored["key"]["interpreter"][2] == str(torch / "__init__.py")
    # Another torch (a reinstall writes its files anew): a miss, then a hit again.
    (torch / "version.py").write_text("__version__ = '2.13.1+cu130'  # reinstalled\n")
    assert _torchprobe.cached_probe(python, 30, str(root), 3600)[1]["cached"] is False
    assert _torchprobe.cached_probe(python, 30, str(root), 3600)[1]["cached"] is True
    # A GPU more (or other) is another machine as far as the probe is concerned.
    second_gpu = tmp_path / "nvidia" / "gpus" / "0000:2a:00.0"
    second_gpu.mkdir()
    (second_gpu / "information").write_text(INFORMATION.replace("18:00.0", "2a:00.0"))
    assert _torchprobe.cached_probe(python, 30, str(root), 3600)[1]["cached"] is False
    assert len(probes) == 3


def test_the_gpus_come_from_the_driver_and_torch_creates_no_cuda_context(tmp_path, monkeypatch):
    """With the driver's files, the probe runs in NVML mode (torch's own count, no device
    properties, which would initialize CUDA) and the GPUs are the driver's, CUDA_VISIBLE_DEVICES
    applied; without them (this machine), torch is asked as before."""
    asked = []

    def fake(python, timeout, nvml=False, prefix=()):
        asked.append(nvml)
        return GOOD[0], dict(GOOD[1], cuda="13.0", cuda_available=True, gpu_count=1, gpus=[])

    monkeypatch.setattr(_torchprobe, "probe_torch", fake)
    monkeypatch.setattr(_torchprobe, "NVIDIA_PROC", driver_dir(tmp_path, {
        "0000:18:00.0": INFORMATION,
        "0000:2a:00.0": INFORMATION.replace("5d6c7f6a", "0a1b2c3d").replace("18:00.0", "2a:00.0")}))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)  # no nvidia-smi
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    _, torch = _torchprobe.probe(sys.executable, 30)
    assert asked == [True]
    assert torch["gpus_from"] == "proc" and torch["driver"] == "570.124.06"
    assert [(g["index"], g["uuid"][:8], g["bus"]) for g in torch["gpus"]] == [
        (0, "0a1b2c3d", "0000:2a:00.0")]
    # MIG instances only CUDA resolves: torch lists them, as without a driver's files.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d")
    assert _torchprobe.probe(sys.executable, 30)[1]["gpus_from"] == "torch"
    monkeypatch.setattr(_torchprobe, "NVIDIA_PROC", str(tmp_path / "none"))
    _, torch = _torchprobe.probe(sys.executable, 30)
    assert asked == [True, False, False]
    assert torch["gpus_from"] == "torch" and torch["driver"] is None


def test_the_nvml_probe_runs_in_a_real_torch(tmp_path):
    """The probe program with its NVML argument in this venv's torch (a CPU build): it answers,
    and a CPU build sees no GPU whatever the driver lists."""
    py, torch = _torchprobe.probe_torch(sys.executable, 120, nvml=True)
    assert py["error"] is None and torch["error"] is None, torch
    assert torch["version"].startswith("2.") and torch["gpu_count"] == 0 and torch["gpus"] == []


def test_a_cached_probes_gpus_take_the_state_read_now():
    # The probe cached GPU 0 with persistence on and no errors; since then it went off and
    # counted ECC errors. The other GPU the driver lists now is none the job sees: not added.
    cached = {"gpus": [{"index": 0, "uuid": "5d6c", "name": "NVIDIA H100 80GB HBM3",
                        "persistence_mode": True, "compute_mode": "Default",
                        "compute_cap": "9.0", "ecc_uncorrected": 0}]}
    now = {"gpus": [{"index": 0, "uuid": "5d6c", "name": "x", "persistence_mode": False,
                     "compute_mode": "Prohibited", "compute_cap": "9.0", "mig_mode": "Enabled",
                     "ecc_uncorrected": 3, "retired_pending": None, "remapped_pending": True},
                    {"index": 1, "uuid": "0a1b", "persistence_mode": True}]}
    gpu = _torchprobe.refresh(cached, now)["gpus"]
    assert len(gpu) == 1 and gpu[0]["name"] == "NVIDIA H100 80GB HBM3"  # not the state's
    assert {k: gpu[0][k] for k in _torchprobe.LIVE} == {
        "persistence_mode": False, "compute_mode": "Prohibited", "compute_cap": "9.0",
        "mig_mode": "Enabled", "ecc_uncorrected": 3, "retired_pending": None,
        "remapped_pending": True}
    # No driver now (nvidia-smi gone): the probe's stays.
    assert _torchprobe.refresh({"gpus": [dict(cached["gpus"][0])]}, None)["gpus"] == \
        cached["gpus"]


def test_gpus_seen_by_nvidia_smi_alone_are_part_of_the_key(tmp_path, probes):
    """A container may see its GPUs through nvidia-smi without the driver's /proc files: a
    replaced GPU or driver there must not reuse the old answer."""
    def smi(uuid, version="570.124.06"):
        return {"gpus": [{"index": 0, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3"}],
                "driver": version, "source": "nvidia-smi"}

    def cached(driver):
        return _torchprobe.cached_probe(sys.executable, 30, str(tmp_path), 3600, driver)[1]

    assert cached(smi("aaaa"))["cached"] is False
    assert cached(smi("aaaa"))["cached"] is True
    assert cached(smi("bbbb"))["cached"] is False
    assert cached(smi("bbbb", "580.65.06"))["cached"] is False


def test_an_image_is_probed_inside_it_and_cached_by_its_id(probes, tmp_path):
    image = {"id": "5eb7d3349f43", "path": "/usr/bin/podman", "image": "localhost/train:1"}
    prefix = ["/usr/bin/podman", "run", "--rm", "5eb7d3349f43"]
    ask = lambda found: _torchprobe.cached_probe("python3", 30, str(tmp_path), 3600, None,  # noqa: E731
                                                found, prefix)[1]["cached"]
    assert ask(image) is False and probes == [("python3", tuple(prefix))]
    assert ask(image) is True and len(probes) == 1
    # The tag moved to another image: probed again; the node's own python3 is another entry.
    assert ask(dict(image, id="0a393fa62322")) is False and len(probes) == 2
    assert _torchprobe.cached_probe("python3", 30, str(tmp_path), 3600, None)[1]["cached"] \
        is False


def test_a_cached_probe_in_an_image_does_not_hide_a_runtime_that_cannot_start_it(
        probes, tmp_path, monkeypatch):
    image = {"runtime": "podman", "path": "/usr/bin/podman", "image": "localhost/train:1",
             "id": "5eb7d3349f43", "pulled": False, "seconds": 0.0, "error": None, "start": None}
    monkeypatch.setattr(_jobenv, "ensure_image", lambda spec, dry: dict(image))
    starts = []
    refused = {"exit": 126, "said": "Error: runc: runc create failed: ... error setting rlimit "
               "type 7: operation not permitted: OCI permission denied",
               "ulimits": ["--ulimit=nofile=20000:20000"], "started": True}
    monkeypatch.setattr(_jobenv, "check_start",
                        lambda found, command, **run: starts.append(command) or (
                            refused if len(starts) > 2 else None))
    spec = {"image": "localhost/train:1", "volumes": [], "options": []}

    def ask():
        return _jobenv.job_interpreter("python3", str(tmp_path), spec, 30, 3600, None, False)

    assert ask()[2]["cached"] is False and ask()[2]["cached"] is True and len(probes) == 1
    # The runtime cannot start the container now: the cached torch is not what the node says.
    found, py, torch = ask()
    assert starts == [["python3", "-c", ""]] * 3
    assert found["start"] == refused and found["error"] == f"podman run failed (exit code 126): " \
        f"{refused['said']}"
    assert torch["version"] is None and py["version"] is None and len(probes) == 1
