"""Which NICs sit near which GPU, read from a /sys PCI tree laid out as on a node of four H100s
(two per CPU socket, each GPU and its NIC behind one PCIe switch) and made here with the links
sysfs has: /sys/class/infiniband/<dev>/device and /sys/bus/pci/devices/<bus> point into
/sys/devices."""

from pathlib import Path

from sysfs_tree import LAYOUT, make_sys

from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import parse_smi
from ansible_collections.torchherd.cluster.plugins.module_utils._hostfacts import (
    gpu_nics,
    nearest,
    pci_bus,
)

STATE = Path(__file__).resolve().parents[1] / "filter" / "fixtures" / "node_state"

def test_pci_addresses_as_sysfs_names_them():
    assert pci_bus("00000000:1B:00.0") == "0000:1b:00.0"
    assert pci_bus("0000:9d:00.0") == "0000:9d:00.0"
    assert pci_bus("") is None and pci_bus(None) is None


def test_each_gpu_is_placed_against_each_nic(tmp_path):
    gpus, _driver = parse_smi((STATE / "smi_query_gpu_4xh100_bus.csv").read_text())
    assert [g["bus"] for g in gpus] == ["00000000:1B:00.0", "00000000:43:00.0",
                                        "00000000:9D:00.0", "00000000:C3:00.0"]
    found = gpu_nics(gpus, *make_sys(tmp_path))
    first, second = gpus[0]["uuid"], gpus[1]["uuid"]
    assert found[first] == {"mlx5_0": "PIX", "mlx5_4": "PHB", "mlx5_1": "NODE",
                            "mlx5_5": "NODE", "mlx5_2": "SYS", "mlx5_3": "SYS"}
    assert found[second]["mlx5_1"] == "PIX" and found[second]["mlx5_5"] == "PXB"
    assert [nearest(found[g["uuid"]]) for g in gpus] == [
        (["mlx5_0"], "PIX"), (["mlx5_1"], "PIX"), (["mlx5_2"], "PIX"), (["mlx5_3"], "PIX")]
    # Without the NIC beside it, GPU 0's nearest are those of its socket.
    assert nearest({d: how for d, how in found[first].items() if d != "mlx5_0"}) == \
        (["mlx5_4"], "PHB")


def test_nothing_to_place_without_a_tree_a_nic_or_a_bus(tmp_path):
    gpus, _driver = parse_smi((STATE / "smi_query_gpu_4xh100_bus.csv").read_text())
    assert gpu_nics(gpus, str(tmp_path / "none"), str(tmp_path / "none")) == {}
    ib, pci = make_sys(tmp_path, {k: v for k, v in LAYOUT.items() if k.startswith("gpu")})
    assert gpu_nics(gpus, ib, pci) == {}
    # nvidia-smi's older answer without the bus (and a GPU sysfs does not list): not placed.
    old, _driver = parse_smi((STATE / "smi_query_gpu_l4.csv").read_text())
    assert old[0]["bus"] is None
    assert gpu_nics(old, *make_sys(tmp_path / "other")) == {}
    assert nearest({}) == ([], None)
