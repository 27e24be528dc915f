"""topology.gpu_links: how the host's GPUs are joined, read from NVML (a fake NVML module here)."""

import importlib

topology = importlib.import_module("tilecomm.topology")  # the module (tilecomm.topology is also a function)


class FakeNvml:
    """Three GPUs: 0-1 joined by NVLink, 0-2 by PCIe peer-to-peer, 1-2 without peer access."""

    NVML_P2P_STATUS_OK = 0
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    BUS = [b"00000000:19:00.0", "00000000:3B:00.0", b"00000000:4C:00.0"]
    NVLINK = {(0, 1)}
    PCIE = {(0, 1), (0, 2)}

    def __init__(self, fail_init=False, fail_query=False):
        self.fail_init, self.fail_query, self.shut = fail_init, fail_query, 0

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML: driver not loaded")

    def nvmlShutdown(self):
        self.shut += 1

    def nvmlDeviceGetCount(self):
        return len(self.BUS)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        return type("Pci", (), {"busId": self.BUS[h]})

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        if self.fail_query:
            raise RuntimeError("NVML: not supported")
        pair = (min(a, b), max(a, b))
        table = self.NVLINK if index == self.NVML_P2P_CAPS_INDEX_NVLINK else self.PCIE
        return 0 if pair in table else 5


def test_every_pair_is_classified():
    got = topology.gpu_links(FakeNvml())
    assert got == [
        ("00000000:19:00.0", "00000000:3B:00.0", "nvlink"),
        ("00000000:19:00.0", "00000000:4C:00.0", "pcie"),
        ("00000000:3B:00.0", "00000000:4C:00.0", "none"),
    ]


def test_no_nvml_says_nothing():
    assert topology.gpu_links(FakeNvml(fail_init=True)) == []
    nvml = FakeNvml(fail_query=True)
    assert topology.gpu_links(nvml) == []
    assert nvml.shut == 1  # shut down again after a failed query


def test_host_mapped_is_auto_for_cpu_links():
    hosts = [("a", "m1"), ("a", "m1"), ("b", "m1")]
    assert topology.links(hosts, "host_mapped") == topology.links(hosts, "auto") == [0, 0, 1]


def test_bus_ids_of_nvml_and_cuda_meet_in_one_form():
    from tilecomm import _C

    # NVML writes an 8-digit domain in upper case, CUDA a 4-digit one in lower case
    assert _C.canonical_bus_id("00000000:3B:00.0") == _C.canonical_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert _C.canonical_bus_id("0001:c1:1f.7") == "0001:c1:1f.7"
    for bad in ("", "3b:00.0", "0000:3b:00", "0000:3b:00.0x", "0000:3b:20.0", "10000:00:00.0", "gpu0"):
        assert _C.canonical_bus_id(bad) == "", bad
