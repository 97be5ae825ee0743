"""The node's side of a locked venv: reuse by its marker, where uv is found, what uv and pip are
told about the index. Making one runs uv: the cluster test (tests/integration/test_venv.py)."""

import json
import os

from ansible_collections.torchherd.cluster.plugins.module_utils import _venv


def made(path, key):
    os.makedirs(path / "bin")
    (path / "bin" / "python").write_text("")
    (path / _venv.MARKER).write_text(json.dumps({"key": key, "uv": "uv 0.13.9",
                                                 "packages": ["thpin==1.0"]}))


def test_a_venv_with_the_same_key_is_reused_without_uv(tmp_path, monkeypatch):
    made(tmp_path / "venvs" / "k1", "k1")
    monkeypatch.setattr(_venv, "find_uv", lambda *a: (_ for _ in ()).throw(AssertionError))
    answer = _venv.ensure(str(tmp_path / "venvs" / "k1"), "thpin==1.0\n", "k1", "/usr/bin/python3",
                          str(tmp_path))
    assert answer["made"] is False and answer["packages"] == ["thpin==1.0"]
    assert answer["python"] == str(tmp_path / "venvs" / "k1" / "bin" / "python")


def test_a_venv_whose_make_died_is_made_again_and_check_mode_only_says_so(tmp_path):
    path = tmp_path / "venvs" / "k1"
    os.makedirs(path / "bin")  # no marker: the make before did not finish
    answer = _venv.ensure(str(path), "thpin==1.0\n", "k1", "/usr/bin/python3", str(tmp_path),
                          dry=True)
    assert answer["missing"] and not answer["made"]


def test_no_uv_and_no_install_is_an_error_that_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(_venv, "find_uv", lambda *a: None)
    try:
        _venv.ensure(str(tmp_path / "v"), "x==1\n", "k", "/usr/bin/python3", str(tmp_path),
                     install=False)
    except _venv.VenvError as exc:
        assert "uv not found" in str(exc) and "~/.local/bin" in str(exc)
    else:
        raise AssertionError("expected a VenvError")


def test_uv_is_found_where_torchherd_installed_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    uv = tmp_path / "tools" / "uv" / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_text("#!/bin/sh\n")
    uv.chmod(0o755)
    assert _venv.find_uv("", "", str(tmp_path)) == [str(uv)]


def test_a_wheelhouse_alone_means_no_index():
    assert _venv._index_args("", ["http://w/"]) == ["--find-links", "http://w/", "--no-index"]
    assert _venv._index_args("https://m/simple", ["/w"]) == [
        "--index-url", "https://m/simple", "--find-links", "/w"]
    assert _venv._index_args("", []) == []


def test_a_venv_made_from_a_venvs_python_sees_that_venvs_packages(tmp_path):
    """This test runs in a venv (pytest is installed there, not beneath it): a venv made from
    its Python with --system-site-packages sees pytest only through the .pth file."""
    import subprocess
    import sys

    made = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(made)], check=True)
    python = str(made / "bin" / "python")
    _venv._see_base_venv(sys.executable, python)
    found = subprocess.run([python, "-c", "import pytest; print(pytest.__file__)"],
                           capture_output=True, text=True, check=False)
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith(sys.prefix)
