"""The cached torch probe: reused only while nothing it depends on changed."""

import json
import os
import sys

import pytest

from ansible_collections.torchherd.cluster.plugins.modules import node_facts

GOOD = ({"path": sys.executable, "version": "3.11.2"},
        {"version": "2.13.0+cpu", "cuda": None, "error": None})


@pytest.fixture
def probes(monkeypatch):
    calls = []

    def fake(python, timeout):
        calls.append(python)
        return GOOD[0], dict(GOOD[1])

    monkeypatch.setattr(node_facts, "probe_torch", fake)
    return calls


def test_second_probe_comes_from_the_cache(tmp_path, probes):
    _, first = node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    _, second = node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["version"] == "2.13.0+cpu"
    assert len(probes) == 1


def test_zero_seconds_probes_every_time_and_writes_nothing(tmp_path, probes):
    for _ in range(2):
        assert node_facts.cached_probe(sys.executable, 30, str(tmp_path), 0)[1]["cached"] is False
    assert len(probes) == 2
    assert not (tmp_path / ".torch-probe.json").exists()


@pytest.mark.parametrize("var", ["LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"])
def test_a_changed_environment_probes_again(tmp_path, probes, monkeypatch, var):
    node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    monkeypatch.setenv(var, "/elsewhere" if var == "LD_LIBRARY_PATH" else "1")
    assert node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False
    assert len(probes) == 2


def test_a_changed_torch_install_probes_again(tmp_path, probes):
    node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    cache = tmp_path / ".torch-probe.json"
    entries = json.loads(cache.read_text())
    # What a reinstall looks like to the fingerprint: other times on torch's files.
    for entry in entries.values():
        entry["key"]["interpreter"][3][1][1] += 1
    cache.write_text(json.dumps(entries))
    assert node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False


def test_an_expired_or_failed_probe_is_not_reused(tmp_path, probes, monkeypatch):
    node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    cache = tmp_path / ".torch-probe.json"
    entries = json.loads(cache.read_text())
    for entry in entries.values():
        entry["at"] -= 7200
    cache.write_text(json.dumps(entries))
    assert node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False
    cache.unlink()
    monkeypatch.setattr(node_facts, "probe_torch", lambda python, timeout: (
        GOOD[0], {"version": None, "error": "ModuleNotFoundError: No module named 'torch'"}))
    node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)
    assert not cache.exists()


def test_a_corrupt_cache_file_is_ignored(tmp_path, probes):
    (tmp_path / ".torch-probe.json").write_text("{not json")
    assert node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is False
    assert node_facts.cached_probe(sys.executable, 30, str(tmp_path), 3600)[1]["cached"] is True


def test_the_fingerprint_in_process_is_the_one_of_a_subprocess(tmp_path):
    """The module's own interpreter is fingerprinted in its process; the same interpreter under
    another spelling of its path runs in a subprocess and gives the same key, so the cache
    holds either way. (Not a link elsewhere: a venv's python away from its pyvenv.cfg is the
    base interpreter, with other packages.)"""
    other = os.path.join(os.path.dirname(sys.executable), ".", os.path.basename(sys.executable))
    here = node_facts.fingerprint(sys.executable, 30)
    there = node_facts.fingerprint(other, 30)
    assert here is not None and there is not None
    assert here == there
    assert here["interpreter"][2] == there["interpreter"][2]  # torch's spec origin
    # A python that is not there cannot be fingerprinted, so the probe runs uncached.
    assert node_facts.fingerprint(str(tmp_path / "missing"), 30) is None


def test_a_node_with_an_nvidia_driver_hits_the_cache(tmp_path, probes, monkeypatch):
    # The driver's files as on a GPU machine: the fingerprint then holds the GPUs, and read
    # back from the cache (JSON) it must still equal a fresh one.
    driver = tmp_path / "driver"
    (driver / "gpus" / "0000:18:00.0").mkdir(parents=True)
    (driver / "gpus" / "0000:18:00.0" / "information").write_text("Model: NVIDIA H100 80GB HBM3\n")
    (driver / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module 580.95.05\n")
    monkeypatch.setattr(node_facts, "NVIDIA_PROC", str(driver))
    root = tmp_path / "root"
    _, first = node_facts.cached_probe(sys.executable, 30, str(root), 3600)
    _, second = node_facts.cached_probe(sys.executable, 30, str(root), 3600)
    assert (first["cached"], second["cached"]) == (False, True)
    assert len(probes) == 1
    # A GPU more (or other) is another machine as far as the probe is concerned.
    (driver / "gpus" / "0000:2a:00.0").mkdir()
    assert node_facts.cached_probe(sys.executable, 30, str(root), 3600)[1]["cached"] is False
