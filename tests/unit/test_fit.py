"""tilecomm.fit: least-squares fits of the selector's constants, and profiles as JSON."""

import json
import logging
import math

import numpy as np
import pytest

from tilecomm import algorithms, fit, selector
from tilecomm.fit import FitWarning

SIZES = [8 * 4**k for k in range(12)]  # 8 B .. 32 MiB
ALPHA, BETA = 12e-6, 1.1e-10
TCP_ALPHA, TCP_BETA = 60e-6, 9e-10
GAMMA = {"float32": 8e-11, "float16": 1.4e-9}
WORLDS = (2, 4)
ALGOS = ["allreduce_ring", "allreduce_recursive_doubling", "broadcast_binomial_tree", "barrier_dissemination"]
TRUE_CORRECTIONS = {
    "2": {
        "allreduce_ring": {"latency": 0.3, "bandwidth": 0.7},
        "broadcast_binomial_tree": {"latency": 0.5, "bandwidth": 1.4},
    },
    "4": {
        "allreduce_recursive_doubling": {"latency": 2.0, "bandwidth": 0.5},
        "barrier_dissemination": {"latency": 0.6, "bandwidth": 1.0},
    },
}
TRUE = {
    "links": {"shm": {"alpha_s": ALPHA, "beta_s_per_byte": BETA},
              "tcp": {"alpha_s": TCP_ALPHA, "beta_s_per_byte": TCP_BETA}},
    "gamma_s_per_byte": {**GAMMA, "default": GAMMA["float32"]},
    "corrections": TRUE_CORRECTIONS,
}


def noisy(t, rng, noise):
    return t * (1 + noise * rng.standard_normal())


def synthetic_points(noise=0.02, seed=0):
    """Raw points as tune records them, generated from TRUE with relative noise."""
    rng = np.random.default_rng(seed)
    links = {name: [[n, noisy(c["alpha_s"] + c["beta_s_per_byte"] * n, rng, noise)] for n in SIZES for _ in range(2)]
             for name, c in TRUE["links"].items()}
    # A reduction call has its own overhead (the intercept), which gamma must not absorb.
    reduce = {d: [[n, noisy(2e-6 + g * n, rng, noise)] for n in SIZES] for d, g in GAMMA.items()}
    collectives = {}
    for world in WORLDS:
        per = collectives.setdefault(str(world), {})
        for name in ALGOS:
            a = algorithms.by_name(name)
            sizes = [0] if a.collective == "barrier" else SIZES
            per[name] = [[n, noisy(selector.predict_algo(a, world, n, TRUE).total_s, rng, noise)] for n in sizes]
    return {"dtype": "float32", "links": links, "reduce": reduce, "collectives": collectives}


@pytest.fixture
def quiet():
    """Fits of clean data must not warn."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FitWarning)
        yield


def test_bounded_lstsq_free_and_clamped():
    A = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert fit.bounded_lstsq(A, A @ [2.0, 3.0], [0, 0]) == pytest.approx([2.0, 3.0])
    # The unconstrained optimum has x0 < 0; the constrained one sits on the bound.
    x = fit.bounded_lstsq(A, [-1.0, 2.0, 1.0], [0, 0])
    assert x[0] == 0 and x[1] > 0
    grid = [(0.0, b) for b in np.linspace(0, 3, 3001)]
    best = min(grid, key=lambda v: np.sum((A @ v - [-1.0, 2.0, 1.0]) ** 2))
    assert x[1] == pytest.approx(best[1], abs=1e-3)
    assert np.all(fit.bounded_lstsq(A, [-1.0, -1.0, -2.0], [0.5, 0.5]) == [0.5, 0.5])


def test_link_fit_recovers_alpha_and_beta(quiet):
    pts = synthetic_points()["links"]["shm"]
    f = fit.fit_affine(pts, "shm", (1.0, 1.0))
    assert f.fitted
    assert f.intercept == pytest.approx(ALPHA, rel=0.05)
    assert f.slope == pytest.approx(BETA, rel=0.03)
    assert f.errors["points"] == len(pts) and f.errors["median"] < 0.03


def test_profile_recovers_every_constant(quiet):
    prof = fit.fit_profile(synthetic_points(), name="synthetic")
    for name, c in TRUE["links"].items():
        got = prof["links"][name]
        assert got["alpha_s"] == pytest.approx(c["alpha_s"], rel=0.05), name
        assert got["beta_s_per_byte"] == pytest.approx(c["beta_s_per_byte"], rel=0.03), name
    for dtype, g in GAMMA.items():
        assert prof["gamma_s_per_byte"][dtype] == pytest.approx(g, rel=0.03)
    assert prof["gamma_s_per_byte"]["default"] == prof["gamma_s_per_byte"]["float32"]
    for world in map(str, WORLDS):
        for name in ALGOS:
            want = TRUE_CORRECTIONS.get(world, {}).get(name, {"latency": 1.0, "bandwidth": 1.0})
            got = prof["corrections"][world][name]
            assert got["latency"] == pytest.approx(want["latency"], rel=0.1), (world, name)
            assert got["bandwidth"] == pytest.approx(want["bandwidth"], rel=0.1), (world, name)
            res = prof["residuals"]["corrections"][world][name]
            assert res["after"]["median"] < 0.05
    # Uncorrected, the model is off for the algorithms whose true corrections are far from 1.
    assert prof["residuals"]["corrections"]["2"]["allreduce_ring"]["before"]["median"] > 0.2
    selector.check_profile(prof)


def test_too_few_points_fall_back_with_a_warning():
    with pytest.warns(FitWarning, match="1 distinct size"):
        f = fit.fit_affine([[1024, 1e-5], [1024, 1.1e-5]], "shm", (4e-6, 5e-10))
    assert (f.intercept, f.slope, f.fitted) == (4e-6, 5e-10, False)
    with pytest.warns(FitWarning, match="0 distinct size"):
        f = fit.fit_affine([], "shm", (4e-6, 5e-10))
    assert (f.intercept, f.slope) == (4e-6, 5e-10) and f.errors["points"] == 0


def test_invalid_points_are_dropped_with_a_warning():
    pts = [[n, ALPHA + BETA * n] for n in SIZES] + [[64, 0.0], [64, -1e-6], [64, math.nan], [-8, 1e-5]]
    with pytest.warns(FitWarning, match="dropped 4 invalid"):
        f = fit.fit_affine(pts, "shm", (1.0, 1.0))
    assert f.intercept == pytest.approx(ALPHA, rel=1e-6) and f.slope == pytest.approx(BETA, rel=1e-6)


def test_very_noisy_points_warn_but_give_usable_constants():
    rng = np.random.default_rng(1)
    pts = [[n, (ALPHA + BETA * n) * math.exp(2 * rng.standard_normal())] for n in SIZES]
    with pytest.warns(FitWarning, match="poor fit"):
        f = fit.fit_affine(pts, "shm", (1.0, 1.0))
    assert f.fitted and all(math.isfinite(v) and v >= 0 for v in (f.intercept, f.slope))


def test_negative_fits_are_clamped_to_zero():
    # Time falling with size: the best line has a negative slope.
    pts = [[n, 1e-3 - 1e-12 * n] for n in SIZES[:8]]
    with pytest.warns(FitWarning, match="per-byte time was negative"):
        f = fit.fit_affine(pts, "shm", (1.0, 1.0))
    assert f.slope == 0 and f.intercept > 0
    # A pure bandwidth link measured with a negative offset.
    pts = [[n, 2e-10 * n - 1e-7] for n in SIZES[4:]]
    with pytest.warns(FitWarning, match="per-call time was negative"):
        f = fit.fit_affine(pts, "shm", (1.0, 1.0))
    assert f.intercept == 0 and f.slope == pytest.approx(2e-10, rel=0.1)


def test_missing_link_class_and_dtype_keep_the_fallback():
    pts = synthetic_points()
    del pts["links"]["shm"]
    del pts["reduce"]["float32"]
    with pytest.warns(FitWarning) as rec:
        prof = fit.fit_profile(pts)
    msgs = " | ".join(str(w.message) for w in rec)
    assert "link class 'shm': no measurements" in msgs and "no float32 measurements" in msgs
    assert prof["links"]["shm"] == selector.DEFAULT_PROFILE["links"]["shm"]
    assert prof["gamma_s_per_byte"]["float32"] == selector.gamma(selector.DEFAULT_PROFILE)
    assert prof["gamma_s_per_byte"]["float16"] == pytest.approx(GAMMA["float16"], rel=0.03)
    selector.check_profile(prof)


def test_no_points_at_all_gives_the_fallback_constants():
    with pytest.warns(FitWarning):
        prof = fit.fit_profile({})
    assert prof["links"] == selector.DEFAULT_PROFILE["links"]
    assert prof["corrections"] == {}
    selector.check_profile(prof)


def test_corrections_recover_known_factors(quiet):
    lat = [1e-5, 1e-5, 1e-5, 1e-5]
    bw = [1e-7, 1e-6, 1e-5, 1e-4]
    samples = [(l, b, 0.4 * l + 1.5 * b) for l, b in zip(lat, bw)]
    c, err = fit.fit_corrections(samples, "x")
    assert c == pytest.approx({"latency": 0.4, "bandwidth": 1.5})
    assert err["worst"] < 1e-9


def test_corrections_with_too_few_points_stay_one():
    with pytest.warns(FitWarning, match="cannot determine 2"):
        c, _ = fit.fit_corrections([(1e-5, 1e-6, 3e-5)], "x")
    assert c == {"latency": 1.0, "bandwidth": 1.0}
    # Several points at one size cannot tell latency from bandwidth.
    with pytest.warns(FitWarning, match="cannot determine 2"):
        c, _ = fit.fit_corrections([(1e-5, 1e-6, 3e-5), (1e-5, 1e-6, 3.2e-5)], "x")
    assert c == {"latency": 1.0, "bandwidth": 1.0}
    with pytest.warns(FitWarning, match="cannot determine"):
        c, _ = fit.fit_corrections([], "x")
    assert c == {"latency": 1.0, "bandwidth": 1.0}


def test_a_part_that_is_always_zero_keeps_one(quiet):
    c, _ = fit.fit_corrections([(2e-5, 0.0, 3e-5)], "barrier")
    assert c == pytest.approx({"latency": 1.5, "bandwidth": 1.0})


def test_corrections_are_kept_above_the_floor():
    samples = [(1e-5, b, 1.0 * b) for b in (1e-6, 1e-5, 1e-4)]  # no latency at all
    with pytest.warns(FitWarning, match="latency correction"):
        c, _ = fit.fit_corrections(samples, "x")
    assert c["latency"] == fit.MIN_CORRECTION
    assert c["bandwidth"] > 0


def test_unregistered_algorithm_points_are_ignored():
    pts = synthetic_points()
    pts["collectives"]["2"]["allreduce_no_such_thing"] = [[8, 1e-5], [64, 2e-5]]
    with pytest.warns(FitWarning, match="'allreduce_no_such_thing' is not registered"):
        prof = fit.fit_profile(pts)
    assert "allreduce_no_such_thing" not in prof["corrections"]["2"]


def test_profile_json_round_trip(tmp_path, quiet):
    prof = fit.fit_profile(synthetic_points(), name="round trip", fingerprint={"hostname": "h", "cpu_count": 2})
    path = tmp_path / "p.json"
    selector.save_profile(prof, str(path))
    back = selector.load_profile(str(path))
    assert back == json.loads(json.dumps(prof))
    a = algorithms.by_name("allreduce_ring")
    for n in (8, 1 << 20):
        assert selector.predict_algo(a, 2, n, back) == selector.predict_algo(a, 2, n, prof)
    assert selector.build_tables(4, {}, back) == selector.build_tables(4, {}, prof)


def test_load_profile_default_logs_that_it_is_used(caplog):
    with caplog.at_level(logging.INFO, logger="tilecomm"):
        assert selector.load_profile(None) is selector.DEFAULT_PROFILE
        assert selector.load_profile("") is selector.DEFAULT_PROFILE
    assert "shipped default" in caplog.text


def _good():
    return json.loads(json.dumps(TRUE))


def _with(path, value):
    prof = _good()
    *keys, last = path
    d = prof
    for k in keys:
        d = d[k]
    if value is _DELETE:
        del d[last]
    else:
        d[last] = value
    return prof


_DELETE = object()
BAD = [
    ("not an object", [1, 2], "expected a JSON object"),
    ("no links", _with(["links"], _DELETE), "missing or empty 'links'"),
    ("no shm", _with(["links"], {"tcp": {"alpha_s": 1.0, "beta_s_per_byte": 1.0}}), "no 'shm'"),
    ("negative alpha", _with(["links", "shm", "alpha_s"], -1e-6), r"links.shm.alpha_s: expected a finite number >= 0"),
    ("string beta", _with(["links", "shm", "beta_s_per_byte"], "fast"), "expected a number"),
    ("bool beta", _with(["links", "shm", "beta_s_per_byte"], True), "expected a number"),
    ("no float32 gamma", _with(["gamma_s_per_byte"], {"float16": 1e-9}), "no 'float32'"),
    ("bad world", _with(["corrections", "two"], {}), "'two' is not a world size"),
    (
        "bad factor",
        _with(["corrections", "2", "allreduce_ring", "latency"], None),
        r"corrections.2.allreduce_ring.latency",
    ),
    ("version", _with(["version"], 99), "schema version 99"),
]


@pytest.mark.parametrize("what,content,match", BAD, ids=[b[0] for b in BAD])
def test_load_profile_rejects_bad_content(tmp_path, what, content, match):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=match) as e:
        selector.load_profile(str(path))
    assert str(path) in str(e.value)


def test_load_profile_rejects_missing_and_malformed_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read it"):
        selector.load_profile(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        selector.load_profile(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_good()))
    assert selector.load_profile(str(good))["corrections"] == TRUE_CORRECTIONS
