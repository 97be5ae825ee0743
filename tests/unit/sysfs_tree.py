"""A /sys PCI tree laid out as on a node of four H100s (two per CPU socket, each GPU and its NIC
behind one PCIe switch), made with the links sysfs has: /sys/class/infiniband/<dev>/device and
/sys/bus/pci/devices/<bus> point into /sys/devices. For the unit tests of which NICs sit near
which GPU (node side) and of the NCCL_IB_HCA the start sets from that (gate)."""

import os

# Device: (its path below /sys/devices, its NUMA node). Root complexes pci0000:16 and :3f on
# socket 0, :9a and :c0 on socket 1; under each a root port, a switch's upstream port and its
# downstream ports, with a GPU on one and a NIC on another. mlx5_4 (storage) hangs off another
# root port of the first root complex; mlx5_5 sits two switches below GPU 1's.
LAYOUT = {
    "gpu0": ("pci0000:16/0000:16:02.0/0000:17:00.0/0000:18:00.0/0000:1b:00.0", 0),
    "mlx5_0": ("pci0000:16/0000:16:02.0/0000:17:00.0/0000:18:01.0/0000:19:00.0", 0),
    "mlx5_4": ("pci0000:16/0000:16:03.0/0000:1f:00.0", 0),
    "gpu1": ("pci0000:3f/0000:3f:02.0/0000:40:00.0/0000:41:00.0/0000:43:00.0", 0),
    "mlx5_1": ("pci0000:3f/0000:3f:02.0/0000:40:00.0/0000:41:01.0/0000:42:00.0", 0),
    "mlx5_5": ("pci0000:3f/0000:3f:02.0/0000:40:00.0/0000:41:02.0/0000:44:00.0/"
               "0000:45:00.0/0000:46:00.0", 0),
    "gpu2": ("pci0000:9a/0000:9a:02.0/0000:9b:00.0/0000:9c:00.0/0000:9d:00.0", 1),
    "mlx5_2": ("pci0000:9a/0000:9a:02.0/0000:9b:00.0/0000:9c:01.0/0000:9e:00.0", 1),
    "gpu3": ("pci0000:c0/0000:c0:02.0/0000:c1:00.0/0000:c2:00.0/0000:c3:00.0", 1),
    "mlx5_3": ("pci0000:c0/0000:c0:02.0/0000:c1:00.0/0000:c2:01.0/0000:c4:00.0", 1),
}


def make_sys(root, layout=LAYOUT, states=None):
    """A /sys with the devices of `layout`; returns (class/infiniband, bus/pci/devices)."""
    ib, pci = root / "class" / "infiniband", root / "bus" / "pci" / "devices"
    ib.mkdir(parents=True)
    pci.mkdir(parents=True)
    for name, (path, numa) in layout.items():
        device = root / "devices" / path
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
        bus = path.rsplit("/", 1)[1]
        (pci / bus).symlink_to(os.path.relpath(device, pci))
        if name.startswith("mlx5"):
            (ib / name).mkdir()
            (ib / name / "device").symlink_to(os.path.relpath(device, ib / name))
            port = ib / name / "ports" / "1"
            port.mkdir(parents=True)
            (port / "state").write_text(f"{(states or {}).get(name, '4: ACTIVE')}\n")
            (port / "link_layer").write_text("InfiniBand\n")
    return str(ib), str(pci)
