"""torchherd init: the files a new user starts from are valid as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader

from driver import cli, scaffold
from driver.inputs import inventory_job
from driver.result import Exit, UsageError
from driver.spec import job_options, load_job, read_job_file, validate

CHECKOUT = Path(__file__).resolve().parents[2]


def test_init_writes_a_job_the_driver_accepts_and_inventories_ansible_parses(tmp_path):
    written = scaffold.init(tmp_path / "project")
    root = tmp_path / "project"
    assert {p.relative_to(root).as_posix() for p in written} >= {
        "job.yml", "inventories/local.ini", "inventories/cluster.ini", "examples/allreduce.py",
        "examples/train_ddp.py"}
    job = load_job(root / "job.yml")  # the driver's own validation
    assert (job["script"], job["code_src"], job["nproc_per_node"]) == ("allreduce.py",
                                                                       "examples", 2)
    assert (root / "examples" / job["script"]).read_bytes() == \
        (CHECKOUT / "examples" / "allreduce.py").read_bytes()
    for name in ("local.ini", "cluster.ini"):
        inventory = InventoryManager(loader=DataLoader(),
                                     sources=[str(root / "inventories" / name)])
        nodes = inventory.get_groups_dict()["torchherd_nodes"]
        assert len(nodes) >= 2, name
        assert all(inventory.get_host(n).vars.get("ansible_host") for n in nodes), name
    # The two nodes of this machine take a master port the master picks free (master_port
    # auto): users and checkouts of one machine do not all meet on 29500.
    _, local_job = inventory_job(str(root / "inventories" / "local.ini"))
    assert validate(local_job)["master_port"] == "auto"
    cluster = InventoryManager(loader=DataLoader(),
                               sources=[str(root / "inventories" / "cluster.ini")])
    group_vars = cluster.groups["torchherd_nodes"].get_vars()
    assert group_vars["ansible_user"]
    # The per-node settings a user of uneven nodes sets: interface and processes (GPUs).
    assert {"torchherd_socket_ifname", "torchherd_nproc_per_node"} <= {
        k for n in cluster.get_groups_dict()["torchherd_nodes"]
        for k in cluster.get_host(n).vars}


def test_every_key_of_the_job_file_is_a_job_key_with_a_valid_default(tmp_path):
    text = scaffold.job_template()
    # Uncommented, every commented key at its shown default still passes the validator.
    uncommented = re.sub(r"^  #(\w+): ", r"  \1: ", text, flags=re.M)
    (tmp_path / "all.yml").write_text(uncommented)
    keys = list(read_job_file(tmp_path / "all.yml"))
    assert keys == list(job_options())
    assert load_job(tmp_path / "all.yml")["excludes"] == job_options()["excludes"]["default"]


def test_init_refuses_to_overwrite_unless_forced(tmp_path, capsys):
    scaffold.init(tmp_path)
    job = tmp_path / "job.yml"
    job.write_text("torchherd_job: {script: mine.py}\n")
    with pytest.raises(UsageError, match=r"init .*: expected none of the files it writes "
                                         r"there, found job\.yml, .*fix: pass --force"):
        scaffold.init(tmp_path)
    assert job.read_text() == "torchherd_job: {script: mine.py}\n"
    assert cli.main(["init", str(tmp_path)]) == Exit.USAGE
    assert job.read_text() == "torchherd_job: {script: mine.py}\n"
    assert cli.main(["init", str(tmp_path), "--force"]) == Exit.OK
    assert job.read_text() == scaffold.job_template()
    assert str(job) in capsys.readouterr().out.splitlines()


def test_the_job_file_names_every_key_of_container_and_venv(tmp_path):
    text = scaffold.job_template()
    for key in ("container", "venv"):
        block = text[text.index(f"  #{key}: "):]
        for sub in job_options()[key]["options"]:
            assert re.search(rf"^  #   {sub} \(", block, flags=re.M), (key, sub)
    assert "runtime (str; auto|podman|docker|apptainer|singularity; default auto)" in text


def test_init_where_it_cannot_write_says_so_without_a_traceback(capsys):
    # /proc takes no new directory, root or not.
    with pytest.raises(UsageError, match=r"init .*: expected a directory it can write "
                                         r"job\.yml into, found: .*fix: choose a directory"):
        scaffold.init("/proc/torchherd-init")
    assert cli.main(["init", "/proc/torchherd-init"]) == Exit.USAGE
    assert "Traceback" not in capsys.readouterr().err


def test_init_into_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="expected a directory, found a file"):
        scaffold.init(tmp_path / "f")


def test_a_refused_init_is_a_usage_document_the_schema_accepts(tmp_path, capsys):
    schema = json.loads((Path(cli.__file__).parent / "schema.json").read_text())
    assert cli.main(["init", str(tmp_path), "--json"]) == Exit.USAGE
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, schema)
    assert doc["action"] == "init" and "--json" in doc["reason"]
