"""/proc/driver/nvidia as the driver writes it on a node of H100s, for the unit tests that read
a node's GPUs without CUDA (module_utils/_gpus, and node_facts' cached torch probe)."""

# gpus/0000:18:00.0/information.
INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 163
GPU UUID: \t GPU-5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d
Video BIOS: \t 96.00.99.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:18:00.0
Device Minor: \t 0
GPU Excluded:\t No
"""
VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  "
           "(dvs-builder@U16-I3-B03-4-3)  Tue Feb 25 04:08:58 UTC 2025\n"
           "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")


def driver_dir(tmp_path, gpus):
    """A recorded /proc/driver/nvidia with these {bus: information} GPUs; its path."""
    proc = tmp_path / "nvidia"
    for bus, text in gpus.items():
        (proc / "gpus" / bus).mkdir(parents=True)
        (proc / "gpus" / bus / "information").write_text(text)
    (proc / "version").write_text(VERSION)
    return str(proc)
