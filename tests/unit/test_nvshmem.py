"""tilecomm.nvshmem: finding NVSHMEM's host library and deciding whether a group offers its algorithms
(no GPU needed; the algorithms themselves run in tests/gpu/test_nvshmem.py)."""

import pytest
from tilecomm import nvshmem, settings


def cfg(**env):
    return settings.resolve({k: str(v) for k, v in env.items()})


def test_library_from_nvshmem_home(tmp_path, monkeypatch):
    lib = tmp_path / "lib" / nvshmem.LIBRARY
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setenv("NVSHMEM_HOME", str(tmp_path))
    assert nvshmem.library() == (str(lib), "")


def test_library_missing_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NVSHMEM_HOME", str(tmp_path))
    monkeypatch.setattr(nvshmem, "_package_roots", list)
    path, why = nvshmem.library()
    assert path == "" and "nvidia-nvshmem-cu13" in why and nvshmem.LIBRARY in why


@pytest.mark.parametrize("env,one_domain,built,why", [
    ({}, True, False, "built without the NVSHMEM headers"),
    ({"TILECOMM_NVSHMEM": "off"}, True, True, "TILECOMM_NVSHMEM=off"),
    ({}, False, True, "spans several hosts"),
])
def test_not_offered(env, one_domain, built, why):
    path, got = nvshmem.offered(cfg(**env), one_domain, built)
    assert path == "" and why in got


def test_offered_where_the_library_is(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / nvshmem.LIBRARY).write_bytes(b"")
    monkeypatch.setenv("NVSHMEM_HOME", str(tmp_path))
    assert nvshmem.offered(cfg(), True, True) == (str(tmp_path / "lib" / nvshmem.LIBRARY), "")


def test_bad_settings_are_errors():
    with pytest.raises(ValueError, match="TILECOMM_NVSHMEM_DATA"):
        cfg(TILECOMM_NVSHMEM_DATA="sideways")
    with pytest.raises(ValueError, match="TILECOMM_NVSHMEM="):
        cfg(TILECOMM_NVSHMEM="maybe")


def test_the_build_says_whether_it_has_the_nvshmem_parts():
    from tilecomm import _C

    assert isinstance(_C.HAS_NVSHMEM, bool)
    assert _C.HAS_NVSHMEM <= _C.HAS_CUDA  # the NVSHMEM parts come only with the CUDA parts
