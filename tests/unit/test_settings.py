"""tilecomm.settings: the one table of TILECOMM_* variables, and docs/env.md generated from it."""

import pathlib

import pytest

from tilecomm import settings

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_defaults():
    got = settings.resolve({})
    assert got == {s.name: s.default for s in settings.SETTINGS}
    assert got["TILECOMM_ALGO"] == ""
    assert got["TILECOMM_SHM_SLOTS"] == 4
    assert got["TILECOMM_SHM_SLOT_BYTES"] == 65536
    assert got["TILECOMM_SPIN_NS"] == -1


def test_every_setting_is_named_tilecomm_and_typed():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names))
    for s in settings.SETTINGS:
        assert s.name.startswith("TILECOMM_")
        assert isinstance(s.default, s.kind)
        assert s.doc.strip()


def test_parsing():
    env = {"TILECOMM_SHM_SLOTS": "8", "TILECOMM_SPIN_NS": "-1", "TILECOMM_ALGO": "ring", "TILECOMM_SLEEP_US": " 100 "}
    got = settings.resolve(env)
    assert got["TILECOMM_SHM_SLOTS"] == 8 and isinstance(got["TILECOMM_SHM_SLOTS"], int)
    assert got["TILECOMM_SPIN_NS"] == -1
    assert got["TILECOMM_ALGO"] == "ring"
    assert got["TILECOMM_SLEEP_US"] == 100
    assert got["TILECOMM_YIELDS"] == 256  # untouched settings keep their defaults


def test_empty_means_default():
    assert settings.resolve({"TILECOMM_SHM_SLOTS": ""})["TILECOMM_SHM_SLOTS"] == 4


def test_unknown_names_the_variables_that_are_no_setting():
    env = {"TILECOMM_SPINS": "64", "TILECOMM_SHM_SLOT": "8", "TILECOMM_FOO": "1", "TILECOMM_ALGO": "ring",
           "TILECOMM_TEST_GPU_WORLDS": "2", "PATH": "/bin"}
    assert settings.unknown(env) == [("TILECOMM_FOO", None), ("TILECOMM_SHM_SLOT", "TILECOMM_SHM_SLOTS"),
                                     ("TILECOMM_SPINS", "TILECOMM_SPIN_NS")]
    assert settings.unknown({"TILECOMM_ALGO": "ring"}) == []


def test_unrelated_variables_are_ignored():
    assert settings.resolve({"TILECOMM_NOT_A_SETTING": "x", "PATH": "/bin"}) == settings.resolve({})


@pytest.mark.parametrize("raw", ["eight", "1.5", "0x10", "4k"])
def test_bad_int_raises_value_error_naming_the_variable(raw):
    with pytest.raises(ValueError, match=r"TILECOMM_SHM_SLOTS=.*expected int"):
        settings.resolve({"TILECOMM_SHM_SLOTS": raw})


def test_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("TILECOMM_YIELDS", "3")
    monkeypatch.delenv("TILECOMM_SHM_SLOTS", raising=False)
    got = settings.resolve()
    assert got["TILECOMM_YIELDS"] == 3
    assert got["TILECOMM_SHM_SLOTS"] == 4


def test_markdown_lists_every_setting():
    md = settings.markdown()
    for s in settings.SETTINGS:
        assert f"`{s.name}`" in md


def test_docs_env_md_is_current():
    path = ROOT / "docs" / "env.md"
    assert path.read_text() == settings.markdown(), "regenerate: python -m tilecomm.settings > docs/env.md"


@pytest.mark.parametrize("raw", ["LL", "fast", "simple,ll"])
def test_unknown_protocol_raises_value_error_listing_the_choices(raw):
    with pytest.raises(ValueError, match=r"TILECOMM_PROTO=.*expected one of auto, ll, simple"):
        settings.resolve({"TILECOMM_PROTO": raw})


def test_protocol_and_ll_crossover_read():
    got = settings.resolve({"TILECOMM_PROTO": "ll", "TILECOMM_LL_BYTES": "4096"})
    assert got["TILECOMM_PROTO"] == "ll" and got["TILECOMM_LL_BYTES"] == 4096


def test_register_bytes_per_collective():
    """TILECOMM_CUDA_REGISTER_BYTES: [all_reduce, all_gather, all_to_all]; a forced all_gather algorithm
    (CPU or CUDA) turns registered outputs off, a forced algorithm of another collective does not;
    all_to_all registers only with TILECOMM_CUDA_ALLTOALL=registered."""
    from tilecomm import _backend, selector  # noqa: PLC0415

    cfg = settings.resolve({})
    size = cfg["TILECOMM_CUDA_REGISTER_BYTES"]
    assert size == 4 << 20
    assert _backend.register_bytes(cfg, {}) == [size, size, 0]
    assert _backend.register_bytes(cfg, selector.parse_forced("all_reduce:ring")) == [size, size, 0]
    assert _backend.register_bytes(cfg, selector.parse_forced("all_gather:ring")) == [size, 0, 0]
    assert _backend.register_bytes(cfg, selector.parse_forced("all_gather:nvshmem_push")) == [size, 0, 0]
    assert _backend.register_bytes(cfg, selector.parse_forced("ring")) == [size, 0, 0]  # every collective's ring
    off = settings.resolve({"TILECOMM_CUDA_REGISTER_BYTES": "0"})
    assert _backend.register_bytes(off, {}) == [0, 0, 0]
    on = settings.resolve({"TILECOMM_CUDA_ALLTOALL": "registered"})
    assert _backend.register_bytes(on, {}) == [size, size, size]
    with pytest.raises(ValueError, match="TILECOMM_CUDA_ALLTOALL"):
        settings.resolve({"TILECOMM_CUDA_ALLTOALL": "push"})


def test_allgather_ll_limit_is_its_own():
    """all_gather's LL limit is not all_reduce's crossover: over GPU memory it runs LL at least up to the
    blocks whose outputs are not registered, and where the model prices the push into registered outputs
    below LL it ends there; over host memory, and without registration, it runs up to the whole LL
    buffer. TILECOMM_LL_BYTES sets both limits."""
    from tilecomm import _backend, cuda_model, selector  # noqa: PLC0415

    cfg = settings.resolve({})
    size = cfg["TILECOMM_CUDA_REGISTER_BYTES"]
    consts = cuda_model.constants({})

    def t(kernel, world, n):
        return cuda_model.predict(kernel, world, n, consts, "cuda_ipc")

    def limits(cfg, world, forced=None):
        got = _backend._cuda_thresholds(cfg, {}, world, _backend.register_bytes(cfg, forced or {}))
        return {m: got[m]["allgather_ll_bytes"] for m in cuda_model.MEMORIES}

    full = cuda_model.LL_MAX_BYTES
    # 2 ranks: every block of the LL buffer has an output below the registration size
    assert size // 2 > full and limits(cfg, 2) == {m: full for m in cuda_model.MEMORIES}
    # 4 and 8 ranks: registered from size / world per rank, where the shipped model prices the push below LL
    for world in (4, 8):
        got = limits(cfg, world)
        assert got["cuda_ipc"] == size // world - 1 < full, (world, got)
        assert got["host_mapped"] == got["nvshmem"] == full
        assert t("allgather_push_registered", world, size // world) < t("allgather_direct_ll", world, size // world)
    # the shipped model's all_reduce crossover over GPU memory is below the LL buffer from 4 ranks
    assert cuda_model.thresholds({}, 4)["cuda_ipc"]["ll_bytes"] < full
    # no registration (off, or an all_gather forced): the whole buffer
    assert limits(settings.resolve({"TILECOMM_CUDA_REGISTER_BYTES": "0"}), 4)["cuda_ipc"] == full
    assert limits(cfg, 4, selector.parse_forced("all_gather:ring"))["cuda_ipc"] == full
    # outputs of every size registered: the model's crossover alone, LL wins up to it and loses after
    every = limits(settings.resolve({"TILECOMM_CUDA_REGISTER_BYTES": "1"}), 4)["cuda_ipc"]
    assert 0 < every < full
    assert t("allgather_direct_ll", 4, every) <= t("allgather_push_registered", 4, every)
    assert t("allgather_direct_ll", 4, 2 * every) > t("allgather_push_registered", 4, 2 * every)
    for value in ("4096", "0"):
        assert set(limits(settings.resolve({"TILECOMM_LL_BYTES": value}), 4).values()) == {int(value)}
