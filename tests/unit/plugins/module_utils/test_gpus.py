"""A node's GPUs read without CUDA: nvidia-smi's query and the driver's /proc files, as recorded
on NVIDIA machines, and CUDA_VISIBLE_DEVICES applied as CUDA applies it."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvidia_proc import INFORMATION, driver_dir

from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import (
    APPS_ARGS,
    HEALTH,
    SMI_ARGS,
    SMI_BASE_ARGS,
    driver_version,
    gpu_files,
    parse_information,
    parse_proc,
    parse_smi,
    read_gpus,
    read_xids,
    visible,
)

# nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,persistence_mode,
# compute_mode --format=csv,noheader,nounits on a node of two H100s.
SMI = ("0, GPU-5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d, NVIDIA H100 80GB HBM3, 81559, 570.124.06, "
       "Enabled, Default\n"
       "1, GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d, NVIDIA H100 80GB HBM3, 81559, 570.124.06, "
       "Disabled, Exclusive_Process\n")


def other(uuid, bus):
    return (INFORMATION.replace("5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d", uuid)
            .replace("0000:18:00.0", bus).replace("Minor: \t 0", "Minor: \t 1"))


def test_nvidia_smis_answer():
    gpus, driver = parse_smi(SMI)
    assert driver == "570.124.06"
    assert gpus[0] == {"index": 0, "uuid": "5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d",
                       "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 * 1024 * 1024,
                       "bus": None, "persistence_mode": True, "compute_mode": "Default",
                       # An answer without the health fields (a driver that lacks them).
                       **dict.fromkeys(key for key, _ in HEALTH)}
    assert (gpus[1]["index"], gpus[1]["persistence_mode"], gpus[1]["compute_mode"]) == \
        (1, False, "Exclusive_Process")


def test_nvidia_smis_unknown_values_are_null_and_other_text_is_refused():
    gpus, _driver = parse_smi("0, GPU-ab, NVIDIA GH200 480GB, [N/A], 570.1, [N/A], Default\n")
    assert gpus[0]["memory_bytes"] is None and gpus[0]["persistence_mode"] is None
    assert parse_smi("") == ([], None)
    with pytest.raises(ValueError, match="not a GPU of nvidia-smi's query"):
        parse_smi("No devices were found\n")


def test_the_drivers_information_file():
    fields = parse_information(INFORMATION)
    assert fields["Model"] == "NVIDIA H100 80GB HBM3"
    assert fields["GPU UUID"] == "GPU-5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d"
    assert fields["Bus Location"] == "0000:18:00.0"  # the value's own colons stay
    assert fields["GPU Excluded"] == "No"


def test_the_drivers_gpus_in_pci_order_without_the_excluded(tmp_path):
    proc = driver_dir(tmp_path, {
        "0000:2a:00.0": other("0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", "0000:2a:00.0"),
        "0000:18:00.0": INFORMATION,
        "0000:3b:00.0": other("99999999-0000-0000-0000-000000000000", "0000:3b:00.0")
        .replace("Excluded:\t No", "Excluded:\t Yes")})
    gpus = parse_proc(gpu_files(proc))
    assert [(g["index"], g["bus"], g["uuid"][:8]) for g in gpus] == [
        (0, "0000:18:00.0", "5d6c7f6a"), (1, "0000:2a:00.0", "0a1b2c3d")]
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3" and gpus[0]["memory_bytes"] is None
    assert driver_version(proc) == "570.124.06"
    assert gpu_files(str(tmp_path / "none")) is None  # no driver loaded


def test_read_takes_nvidia_smi_then_the_drivers_files_then_nothing(tmp_path):
    proc = driver_dir(tmp_path, {"0000:18:00.0": INFORMATION})
    # An nvidia-smi that answers the recorded query only when asked exactly that.
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   f"[ \"$*\" = \"{' '.join(SMI_ARGS)}\" ] || exit 2\n"
                   f"printf '%s' '{SMI}'\n")
    smi.chmod(0o755)
    found = read_gpus(proc, smi=str(smi))
    assert found["source"] == "nvidia-smi" and len(found["gpus"]) == 2
    assert found["gpus"][0]["memory_bytes"] == 81559 * 1024 * 1024
    # nvidia-smi that finds no GPU (exit 6), or none on PATH: the driver's files.
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    for tried in (str(smi), ""):
        found = read_gpus(proc, smi=tried)
        assert found["source"] == "proc" and found["driver"] == "570.124.06"
        assert [g["uuid"][:8] for g in found["gpus"]] == ["5d6c7f6a"]
    # A machine without an NVIDIA driver (this one): nothing to tell, torch is asked.
    assert read_gpus(str(tmp_path / "none"), smi="") is None


GPUS = parse_smi(SMI)[0]


@pytest.mark.parametrize("cvd, shown", [
    (None, [0, 1]),
    ("", []),
    ("1", [1]),
    ("1,0", [1, 0]),
    ("0,7,1", [0]),  # CUDA ends the list at the first entry that names no GPU
    ("GPU-0a1b2c3d", [1]),  # a UUID's prefix will do
    ("GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d,0", [1, 0]),
    ("-1", []),
])
def test_cuda_visible_devices_as_cuda_reads_it(cvd, shown):
    got = visible(GPUS, cvd)
    assert [g["uuid"] for g in got] == [GPUS[i]["uuid"] for i in shown]
    assert [g["index"] for g in got] == list(range(len(shown)))  # CUDA numbers them anew


@pytest.mark.parametrize("cvd", ["MIG-5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d", "0,0"])
def test_what_only_cuda_can_resolve_is_left_to_it(cvd):
    assert visible(GPUS, cvd) is None


def test_a_uuid_prefix_of_several_gpus_names_none():
    assert visible(GPUS, "GPU-,0") == []


def test_indices_among_gpus_of_other_models_follow_cudas_order():
    mixed = [GPUS[0], dict(GPUS[1], name="NVIDIA L40S")]
    assert visible(mixed, "1") is None  # CUDA puts the faster first by default
    assert [g["name"] for g in visible(mixed, "1", "PCI_BUS_ID")] == ["NVIDIA L40S"]
    assert len(visible(mixed, None)) == 2  # all of them, whatever their order


STATE = (Path(__file__).resolve().parents[1] / "filter" / "fixtures" / "node_state")


def test_the_health_fields_of_nvidia_smis_answer():
    gpus, driver = parse_smi((STATE / "smi_query_gpu_8xh100.csv").read_text())
    assert driver == "570.124.06" and len(gpus) == 8
    assert {k: gpus[5][k] for k, _ in HEALTH} == {
        "compute_cap": "9.0", "mig_mode": "Disabled", "ecc_uncorrected": 2,
        "retired_pending": None, "remapped_pending": True}  # H100s retire no pages: [N/A]
    assert (gpus[3]["compute_mode"], gpus[4]["mig_mode"]) == ("Prohibited", "Enabled")


def test_read_asks_both_queries_and_falls_back_to_the_base_one(tmp_path):
    query = (STATE / "smi_query_gpu_l4.csv").read_text()
    apps = (STATE / "smi_compute_apps.csv").read_text()
    smi = tmp_path / "nvidia-smi"
    # A driver that knows every field, then one that refuses the health fields (exit 2).
    for health in ("ok", "refused"):
        smi.write_text(
            "#!/bin/sh\n"
            f"[ \"$*\" = \"{' '.join(APPS_ARGS)}\" ] && {{ printf '%s' '{apps}'; exit 0; }}\n"
            f"[ \"$*\" = \"{' '.join(SMI_ARGS)}\" ] && [ {health} = ok ] && "
            f"{{ printf '%s' '{query}'; exit 0; }}\n"
            f"[ \"$*\" = \"{' '.join(SMI_BASE_ARGS)}\" ] && "
            f"{{ printf '%s' '{SMI.splitlines()[0]}'; exit 0; }}\n"
            "echo 'Field \"compute_cap\" is not a valid field to query.'; exit 2\n")
        smi.chmod(0o755)
        found = read_gpus(str(tmp_path / "none"), smi=str(smi))
        assert found["source"] == "nvidia-smi"
        assert [p["pid"] for p in found["processes"]] == [31337, 31400]
        cap = found["gpus"][0]["compute_cap"]
        assert cap == ("8.9" if health == "ok" else None)


def test_the_kernel_logs_xids_read_as_dev_kmsg_gives_them(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text((STATE / "kmsg_xid.txt").read_text())
    xids = read_xids(str(log))
    assert [x.split("): ")[1].split(",")[0] for x in xids] == ["48", "63"]
    assert read_xids(str(log), limit=1) == xids[1:]
    assert read_xids(str(tmp_path / "none")) is None  # unreadable: nothing said
