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
    """TILECOMM_CUDA_REGISTER_BYTES: [all_reduce, all_gather, all_to_all, captured all_reduce]; a forced
    all_gather algorithm (CPU or CUDA) turns registered outputs off, a forced algorithm of another
    collective does not; all_to_all registers only with TILECOMM_CUDA_ALLTOALL=registered; a captured
    all_reduce registers from TILECOMM_CUDA_CAPTURE_REGISTER_BYTES where that is smaller and not 0."""
    from tilecomm import _backend, selector  # noqa: PLC0415

    cfg = settings.resolve({})
    size = cfg["TILECOMM_CUDA_REGISTER_BYTES"]
    captured = cfg["TILECOMM_CUDA_CAPTURE_REGISTER_BYTES"]
    assert size == 4 << 20 and captured == 1 << 20
    assert _backend.register_bytes(cfg, {}) == [size, size, 0, captured]
    assert _backend.register_bytes(cfg, selector.parse_forced("all_reduce:ring")) == [size, size, 0, captured]
    assert _backend.register_bytes(cfg, selector.parse_forced("all_gather:ring")) == [size, 0, 0, captured]
    assert _backend.register_bytes(cfg, selector.parse_forced("all_gather:nvshmem_push")) == [size, 0, 0, captured]
    every = selector.parse_forced("ring")  # every collective's ring
    assert _backend.register_bytes(cfg, every) == [size, 0, 0, captured]
    off = settings.resolve({"TILECOMM_CUDA_REGISTER_BYTES": "0"})
    assert _backend.register_bytes(off, {}) == [0, 0, 0, 0]
    on = settings.resolve({"TILECOMM_CUDA_ALLTOALL": "registered"})
    assert _backend.register_bytes(on, {}) == [size, size, size, captured]
    same = settings.resolve({"TILECOMM_CUDA_CAPTURE_REGISTER_BYTES": "0"})
    assert _backend.register_bytes(same, {}) == [size, size, 0, size]
    low = settings.resolve({"TILECOMM_CUDA_REGISTER_BYTES": "65536"})  # the smaller applies
    assert _backend.register_bytes(low, {}) == [65536, 65536, 0, 65536]
    with pytest.raises(ValueError, match="TILECOMM_CUDA_ALLTOALL"):
        settings.resolve({"TILECOMM_CUDA_ALLTOALL": "push"})


def test_allgather_ll_limit_is_its_own():
    """all_gather runs LL up to the whole LL buffer, whatever all_reduce's crossover of the CUDA model; an
    output that registers leaves LL from where the model prices the push into registered outputs below
    it. TILECOMM_LL_BYTES sets all of them."""
    from tilecomm import _backend, cuda_model  # noqa: PLC0415

    cfg = settings.resolve({})
    full = cuda_model.LL_MAX_BYTES
    assert _backend.allgather_ll_bytes(cfg) == full
    # the shipped model's all_reduce crossover over GPU memory is below the LL buffer from 4 ranks
    assert cuda_model.thresholds({}, 4)["cuda_ipc"]["ll_bytes"] < full
    consts = cuda_model.constants({})

    def t(kernel, world, n):
        return cuda_model.predict(kernel, world, n, consts, "cuda_ipc")

    for world in (2, 4, 8):
        at = _backend.allgather_register_ll_bytes(cfg, {}, world)
        assert at == cuda_model.allgather_register_ll_bytes({}, world)
        assert 0 < at < full, (world, at)  # the push overtakes LL inside the LL buffer from 2 ranks
        assert t("allgather_direct_ll", world, at) <= t("allgather_push_registered", world, at)
        assert t("allgather_direct_ll", world, 2 * at) > t("allgather_push_registered", world, 2 * at)
    # more ranks: LL writes 2 (p - 1) bytes per byte, the push p, so the push overtakes it sooner
    assert cuda_model.allgather_register_ll_bytes({}, 8) <= cuda_model.allgather_register_ll_bytes({}, 2)
    for value in ("4096", "0"):
        forced = settings.resolve({"TILECOMM_LL_BYTES": value})
        assert _backend.allgather_ll_bytes(forced) == _backend.allgather_register_ll_bytes(forced, {}, 4) == int(value)
