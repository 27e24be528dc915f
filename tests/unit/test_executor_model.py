"""tilecomm.executor_model: the schedule executor's cost model, its fit to bench records, and its tables."""

import json
import math

import pytest

from tilecomm import algorithms, executor_model, fit, selector

# Clearly unlike executor_model.DEFAULT's cuda_ipc (each constant off by 2x or more).
KNOWN = {"alpha_s": 4e-6, "alpha_round_s": 7e-6, "alpha_step_s": 1.5e-7, "beta_s_per_byte": 3e-11}
WORLDS = (2, 4, 8)
SIZES = (8, 256, 8192, 262144, 1 << 20, 16 << 20)


def records(consts=KNOWN, worlds=WORLDS, sizes=SIZES, noise=0.0, **extra):
    """``python -m tilecomm.bench --device cuda --graph``-style rows of every scheduled algorithm forced in
    turn, whose times follow `consts` exactly (microseconds), but for an alternating +-`noise`."""
    out = []
    for c in executor_model.COLLECTIVES:
        for p in worlds:
            for n in [0] if c == "barrier" else sizes:
                for a in executor_model.candidates(c):
                    wobble = 1 + noise * (-1) ** len(out)
                    t = executor_model.predict(a, p, n, consts) * 1e6 * wobble
                    out.append({"collective": c, "backend": f"tilecomm:{a.short}", "world": p, "bytes": n,
                                "time_us": t, "device": "cuda", "graph": True, "wrong": 0, **extra})
    return out


def n_points(worlds=WORLDS, sizes=SIZES):
    return sum(len(executor_model.candidates(c)) * len(worlds) * (1 if c == "barrier" else len(sizes))
               for c in executor_model.COLLECTIVES)


def profile_with(consts):
    prof = json.loads(json.dumps(selector.DEFAULT_PROFILE))
    prof["cuda_executor"] = {"cuda_ipc": dict(consts)}
    return prof


def test_known_differs_from_default():
    """The constants the fit must find are not the ones it would keep."""
    for key, want in KNOWN.items():
        got = executor_model.DEFAULT["cuda_ipc"][key]
        assert not got == pytest.approx(want, rel=0.5), key


def test_predict_is_the_documented_formula():
    """alpha + rounds * alpha_round + steps * p * alpha_step + wire * n * beta; ring all_reduce at 4 ranks
    takes 2 (p - 1) rounds, sends and receives in each, and sends 2 (p - 1) / p bytes per buffer byte."""
    ring = algorithms.by_name("allreduce_ring")
    assert executor_model.features(ring, 4) == (6, 1.5, 12)
    want = KNOWN["alpha_s"] + 6 * KNOWN["alpha_round_s"] + 12 * 4 * KNOWN["alpha_step_s"] + 1.5 * 1000 * KNOWN[
        "beta_s_per_byte"]
    assert executor_model.predict(ring, 4, 1000, KNOWN) == pytest.approx(want, rel=1e-12)


def test_fit_recovers_known_constants():
    """Exact times of every scheduled algorithm at 2, 4 and 8 ranks give back their constants."""
    consts, notes = executor_model.fit(records())
    got = consts["cuda_ipc"]
    for key, want in KNOWN.items():
        assert got[key] == pytest.approx(want, rel=1e-6), key
    assert got["fit"]["points"] == n_points()
    assert got["fit"]["median_error"] < 1e-9 and got["fit"]["worst_error"] < 1e-6
    # nothing was measured over host memory: its constants stay the default's, and a note says so
    assert consts["host_mapped"] == executor_model.DEFAULT["host_mapped"]
    assert len(notes) == 1 and "host_mapped" in notes[0] and "kept the current constants" in notes[0]


def test_fit_with_noise_stays_close():
    """+-5% alternating noise: the fitted constants predict every point within 15%."""
    consts, _ = executor_model.fit(records(noise=0.05))
    c = consts["cuda_ipc"]
    assert c["fit"]["median_error"] < 0.1
    for coll in executor_model.COLLECTIVES:
        for a in executor_model.candidates(coll):
            for p in WORLDS:
                for n in [0] if coll == "barrier" else SIZES:
                    want = executor_model.predict(a, p, n, KNOWN)
                    assert executor_model.predict(a, p, n, c) == pytest.approx(want, rel=0.15), (a.name, p, n)


def test_too_few_points_keep_the_defaults():
    """One world size cannot tell the terms apart: the constants stay the default's, and only that world
    size's corrections are fitted (the others' stay); no records at all give the defaults."""
    consts, notes = executor_model.fit(records(worlds=(4,)))
    default = executor_model.constants(None)
    assert consts["host_mapped"] == default["host_mapped"]
    for k in executor_model.KEYS:
        assert consts["cuda_ipc"][k] == default["cuda_ipc"][k], k
    got, shipped = consts["cuda_ipc"]["corrections"], default["cuda_ipc"]["corrections"]
    assert got["2"] == shipped["2"] and got["8"] == shipped["8"] and got["4"] != shipped["4"]
    assert len(notes) == 2 and all("kept the current constants" in n for n in notes)
    assert "cuda_ipc" in notes[0] and "host_mapped" in notes[1]
    consts, notes = executor_model.fit([])
    assert consts == executor_model.constants(None) == executor_model.DEFAULT
    assert len(notes) == 2
    # a base section is what is kept
    base = {"cuda_ipc": KNOWN}
    consts, _ = executor_model.fit([], base)
    assert consts["cuda_ipc"] == KNOWN and consts["host_mapped"] == executor_model.DEFAULT["host_mapped"]


def test_fitted_constants_that_choose_worse_are_not_taken():
    """Times the constants cannot follow (reduce's binomial tree at a fifth of what KNOWN predicts):
    least squares moves every constant to meet them, and its tables then choose worse on these very
    points than KNOWN's do. The fit keeps the current constants and says so; where the fitted ones
    choose as well, they are taken."""
    recs = records()
    for r in recs:
        if r["collective"] == "reduce" and r["backend"] == "tilecomm:binomial_tree":
            r["time_us"] *= 0.2
    base = executor_model.constants({"cuda_executor": {"cuda_ipc": KNOWN}})
    assert fit.mean_regret(executor_model.regret(recs, base), "cuda_ipc") == pytest.approx(1.0)
    consts, notes = executor_model.fit(recs, {"cuda_ipc": KNOWN})
    assert {k: consts["cuda_ipc"][k] for k in KNOWN} == KNOWN
    # and the corrections then meet the tree's times: its factors at 0.2
    tree = consts["cuda_ipc"]["corrections"]["4"]["reduce_binomial_tree"]
    assert tree == pytest.approx({"latency": 0.2, "bandwidth": 0.2}, rel=1e-6)
    worse = [n for n in notes if "choose worse" in n]
    assert len(worse) == 1 and "cuda_executor cuda_ipc" in worse[0] and "against 1.000" in worse[0], notes
    # exact times: the fitted constants (KNOWN again) choose as well as any, and are taken
    consts, notes = executor_model.fit(records(), executor_model.DEFAULT)
    assert consts["cuda_ipc"]["alpha_s"] == pytest.approx(KNOWN["alpha_s"], rel=1e-6)
    assert not any("choose worse" in n for n in notes)


def test_samples_skip_what_the_executor_did_not_time():
    """Failures, eager and CPU rows, the group's own choice, unknown and direct algorithms are not fitted."""
    good = {"collective": "all_reduce", "backend": "tilecomm:ring", "world": 4, "bytes": 1024, "time_us": 20.0,
            "device": "cuda", "graph": True, "wrong": 0}
    got = executor_model.samples([good])
    assert len(got) == 1
    m, a, p, n, t = got[0]
    assert (m, a.name, p, n) == ("cuda_ipc", "allreduce_ring", 4, 1024) and t == pytest.approx(20e-6)
    bad = [
        {"wrong": 3},
        {"graph": False},
        {"device": "cpu"},
        {"backend": "tilecomm"},  # the group's own choice validates the fit
        {"backend": "tilecomm:no_such_algorithm"},
        {"backend": "tilecomm:broadcast_pipelined_chain"},  # full names are not bench's backends
        {"backend": "tilecomm:pipelined_chain"},  # a broadcast algorithm, not an all_reduce one
        {"backend": "tilecomm:one_shot"},  # direct: the executor does not run it
        {"collective": "reduce_scatter", "backend": "tilecomm:direct"},  # direct too
        {"collective": "all_to_all", "backend": "tilecomm:pairwise"},  # all_to_all runs only direct kernels
        {"backend": "gloo"},
        {"time_us": 0.0},
        {"time_us": -5.0},
        {"time_us": "failed"},
    ]
    for change in bad:
        assert executor_model.samples([{**good, **change}]) == [], change
    no_graph = dict(good)
    del no_graph["graph"]
    assert executor_model.samples([no_graph]) == []
    # the group's own transport (bench's CUDA rows), or the TILECOMM_TRANSPORT of older records
    hm = executor_model.samples([{**good, "transport": t} for t in ("host_mapped", "shm", "cuda_ipc", "auto",
                                                                     "staged", "unset", "tcp")])
    assert [m for m, *_ in hm] == ["host_mapped", "cuda_ipc", "cuda_ipc", "cuda_ipc"]
    # scheduled algorithms whose short name is "direct" are the executor's
    gathers = executor_model.samples([{**good, "collective": "all_gather", "backend": "tilecomm:direct"},
                                      {**good, "collective": "gather", "backend": "tilecomm:direct"}])
    assert [a.name for _, a, *_ in gathers] == ["allgather_direct", "gather_direct"]


def test_fit_host_mapped_records():
    """Rows measured with TILECOMM_TRANSPORT=host_mapped fit that memory's constants, not GPU memory's."""
    hm = {**KNOWN, "beta_s_per_byte": 9e-11}
    consts, notes = executor_model.fit(records() + records(hm, transport="host_mapped"))
    assert notes == []
    for key in KNOWN:
        assert consts["cuda_ipc"][key] == pytest.approx(KNOWN[key], rel=1e-6), key
        assert consts["host_mapped"][key] == pytest.approx(hm[key], rel=1e-6), key
    assert consts["host_mapped"]["fit"]["points"] == n_points()


@pytest.mark.parametrize("prof", [None, "known"])
def test_tables_pick_the_least_predicted(prof):
    """Every table covers every size, names only its collective's scheduled algorithms, and picks the least
    predicted time at every power of two."""
    profile = selector.DEFAULT_PROFILE if prof is None else profile_with(KNOWN)
    consts = executor_model.constants(profile)
    for p in (2, 3, 4, 8):
        tables = executor_model.build_tables(p, {}, profile)
        assert set(tables) == set(executor_model.MEMORIES)
        for m in executor_model.MEMORIES:
            assert set(tables[m]) == set(executor_model.COLLECTIVES)
            for coll, table in tables[m].items():
                cands = executor_model.candidates(coll)
                assert table[-1][0] == executor_model.MAX_BYTES
                assert [hi for hi, _ in table] == sorted(hi for hi, _ in table)
                assert {aid for _, aid in table} <= {a.id for a in cands}
                for k in range(31):
                    n = 1 << k
                    algo = selector.lookup(table, n)
                    assert algo.collective == coll and not algo.direct
                    best = min(executor_model.predict(a, p, n, consts[m]) for a in cands)
                    assert executor_model.predict(algo, p, n, consts[m]) == best, (m, coll, p, n, algo.name)
                assert selector.lookup(table, executor_model.MAX_BYTES) in cands


def test_forced_algorithm_gives_one_entry():
    forced = {"broadcast": "broadcast_pipelined_chain"}
    tables = executor_model.build_tables(8, forced, None)
    for m in executor_model.MEMORIES:
        assert tables[m]["broadcast"] == [(executor_model.MAX_BYTES, algorithms.by_name(forced["broadcast"]).id)]
        assert len(tables[m]["all_reduce"]) >= 1


def test_tables_survive_json():
    """The tables go to the engine as JSON: only tuples become lists."""
    tables = executor_model.build_tables(4, {}, profile_with(KNOWN))
    back = json.loads(json.dumps(tables))
    assert back == {m: {c: [list(e) for e in t] for c, t in per.items()} for m, per in tables.items()}


def test_constants_steer_the_tables():
    """Expensive rounds pick a shallower all_reduce at 8 ranks than free rounds do."""
    n = 1024
    shallow = {"alpha_s": 1e-5, "alpha_round_s": 1e-3, "alpha_step_s": 0.0, "beta_s_per_byte": 1e-11}
    free = {**shallow, "alpha_round_s": 0.0}
    picked = {}
    for name, consts in (("rounds", shallow), ("free", free)):
        table = executor_model.build_tables(8, {}, profile_with(consts))["cuda_ipc"]["all_reduce"]
        picked[name] = selector.lookup(table, n)
    rounds = {k: executor_model.features(a, 8)[0] for k, a in picked.items()}
    assert rounds["rounds"] < rounds["free"], picked
    # the profile's host_mapped entry was left out: it takes the default's
    assert executor_model.constants(profile_with(free))["host_mapped"] == executor_model.DEFAULT["host_mapped"]


def test_check_rejects_bad_sections():
    executor_model.check(executor_model.DEFAULT, "x")
    executor_model.check({}, "x")
    fitted, _ = executor_model.fit(records())
    executor_model.check(fitted, "x")
    for bad, what in (
        ([], "expected an object"),
        ({"nvlink": KNOWN}, "nvlink"),
        ({"cuda_ipc": 5}, "cuda_ipc"),
        ({"cuda_ipc": {**KNOWN, "alpha_s": -1e-6}}, "alpha_s"),
        ({"cuda_ipc": {k: v for k, v in KNOWN.items() if k != "alpha_round_s"}}, "alpha_round_s"),
        ({"cuda_ipc": {**KNOWN, "alpha_step_s": True}}, "alpha_step_s"),
        ({"cuda_ipc": {**KNOWN, "beta_s_per_byte": math.inf}}, "beta_s_per_byte"),
        ({"host_mapped": {**KNOWN, "beta_s_per_byte": math.nan}}, "host_mapped.beta_s_per_byte"),
        ({"cuda_ipc": {**KNOWN, "alpha_s": "1e-6"}}, "alpha_s"),
        ({"cuda_ipc": {**KNOWN, "corrections": []}}, "corrections: expected an object"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"x": {}}}}, "'x' is not a world size"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"0": {}}}}, "'0' is not a world size"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"04": {}}}}, "'04' is not a world size"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"17": {}}}}, "'17' is not a world size of 1 to 16"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"4": {"allreduce_ring": {"latency": 0, "bandwidth": 1}}}}},
         "allreduce_ring: factors must be > 0"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"4": {"allreduce_one_shot": {"latency": 1, "bandwidth": 1}}}}},
         "'allreduce_one_shot' is not an algorithm of this section"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"4": {"allreduce_ring": {"latency": -1, "bandwidth": 1}}}}},
         "corrections.4.allreduce_ring.latency"),
        ({"cuda_ipc": {**KNOWN, "corrections": {"4": {"allreduce_ring": {"latency": 1}}}}},
         "corrections.4.allreduce_ring.bandwidth"),
    ):
        with pytest.raises(ValueError, match=what):
            executor_model.check(bad, "x")


def test_profile_cuda_executor_section_is_checked(tmp_path):
    selector.check_profile(selector.DEFAULT_PROFILE)
    prof = json.loads(json.dumps(selector.DEFAULT_PROFILE))
    prof["cuda_executor"], _ = executor_model.fit(records())
    selector.check_profile(prof)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    loaded = selector.load_profile(str(path))
    assert executor_model.constants(loaded)["cuda_ipc"]["alpha_round_s"] == pytest.approx(KNOWN["alpha_round_s"])
    prof["cuda_executor"]["cuda_ipc"]["beta_s_per_byte"] = -1e-12
    with pytest.raises(ValueError, match="cuda_executor.cuda_ipc.beta_s_per_byte"):
        selector.check_profile(prof)
    path.write_text(json.dumps(prof))
    with pytest.raises(ValueError, match="beta_s_per_byte"):
        selector.load_profile(str(path))


def test_regret_of_the_true_constants_is_one():
    recs = records()
    regrets = executor_model.regret(recs, {"cuda_ipc": KNOWN, "host_mapped": executor_model.DEFAULT["host_mapped"]})
    # every collective with a choice, at every world size, over GPU memory only
    with_choice = [c for c in executor_model.COLLECTIVES if len(executor_model.candidates(c)) > 1]
    assert set(regrets) == {("cuda_ipc", p, c) for p in WORLDS for c in with_choice}
    for key, rs in regrets.items():
        assert [n for n, *_ in rs] == list(SIZES), key
        assert all(r == 1.0 for _, r, _, _ in rs), (key, rs)


def test_regret_of_wrong_constants_exceeds_one():
    """Free bytes and costly rounds choose the shallow algorithms where bandwidth decides."""
    wrong = {"alpha_s": KNOWN["alpha_s"], "alpha_round_s": 1.0, "alpha_step_s": 0.0, "beta_s_per_byte": 0.0}
    regrets = executor_model.regret(records(), {"cuda_ipc": wrong, "host_mapped": wrong})
    worst = max(r for rs in regrets.values() for _, r, _, _ in rs)
    assert worst > 1.0
    big = dict((n, r) for n, r, _, _ in regrets[("cuda_ipc", 8, "all_reduce")])
    assert big[16 << 20] > 1.0


def test_measured_regret_of_the_groups_own_choice():
    recs = records()
    p, coll, n = 4, "all_reduce", 8192
    fastest = min(r["time_us"] for r in recs
                  if (r["world"], r["collective"], r["bytes"]) == (p, coll, n))
    own = {"collective": coll, "backend": "tilecomm", "world": p, "bytes": n, "time_us": 1.5 * fastest,
           "device": "cuda", "graph": True, "wrong": 0}
    eager = {**own, "graph": False, "time_us": 10 * fastest}  # not a graph time: not counted
    wrong = {**own, "bytes": 8, "time_us": 10 * fastest, "wrong": 3}  # a wrong result: not counted
    # host_mapped's own choice is compared with host_mapped's forced times only (none here)
    other = {**own, "transport": "host_mapped", "time_us": 10 * fastest}
    got = executor_model.measured_regret(recs + [own, eager, wrong, other])
    assert set(got) == {("cuda_ipc", p, coll)}
    assert len(got[("cuda_ipc", p, coll)]) == 1
    size, ratio = got[("cuda_ipc", p, coll)][0]
    assert size == n and ratio == pytest.approx(1.5)
    assert executor_model.measured_regret(recs) == {}


def test_tune_executor_from_writes_a_profile(tmp_path, capsys, monkeypatch):
    from tilecomm import tune

    monkeypatch.delenv("TILECOMM_PROFILE", raising=False)
    recs = records()
    src, out = tmp_path / "bench.jsonl", tmp_path / "prof.json"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert tune.main(["--executor-from", str(src), "-o", str(out)]) == 0
    prof = selector.load_profile(str(out))
    for key, want in KNOWN.items():
        assert prof["cuda_executor"]["cuda_ipc"][key] == pytest.approx(want, rel=1e-6), key
    assert prof["cuda_executor"]["host_mapped"] == executor_model.DEFAULT["host_mapped"]
    assert any("host_mapped" in w for w in prof["warnings"])
    # the rest of the profile is the shipped default's
    assert prof["links"] == selector.DEFAULT_PROFILE["links"]
    captured = capsys.readouterr()
    assert "| cuda_ipc |" in captured.out and "| host_mapped |" in captured.out
    assert "kept the current constants" in captured.err
    assert "| 8 | all_reduce |" in captured.out


def test_tune_executor_from_several_files(tmp_path, capsys, monkeypatch):
    """Several files add up: one world size each is enough together."""
    from tilecomm import tune

    monkeypatch.delenv("TILECOMM_PROFILE", raising=False)
    paths = []
    for p in WORLDS:
        path = tmp_path / f"bench-{p}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records(worlds=(p,))))
        paths.append(str(path))
    out = tmp_path / "prof.json"
    assert tune.main(["--executor-from", *paths, "-o", str(out)]) == 0
    prof = selector.load_profile(str(out))
    assert prof["cuda_executor"]["cuda_ipc"]["beta_s_per_byte"] == pytest.approx(KNOWN["beta_s_per_byte"], rel=1e-6)
    assert prof["cuda_executor"]["cuda_ipc"]["fit"]["points"] == n_points()
    capsys.readouterr()


def with_corrections(consts, corrections):
    return {**consts, "corrections": corrections}


def test_predict_applies_the_corrections():
    """The latency factor scales the call, round and step terms, the bandwidth factor the wire term, of
    that algorithm at that world size only."""
    ring = algorithms.by_name("allreduce_ring")
    c = with_corrections(KNOWN, {"4": {"allreduce_ring": {"latency": 0.5, "bandwidth": 3.0}}})
    plain = executor_model.parts(ring, 4, 1000, KNOWN)
    assert executor_model.parts(ring, 4, 1000, c) == pytest.approx([0.5 * x for x in plain[:3]] + [3.0 * plain[3]])
    assert executor_model.predict(ring, 4, 1000, c) == pytest.approx(0.5 * sum(plain[:3]) + 3.0 * plain[3])
    assert executor_model.predict(ring, 8, 1000, c) == executor_model.predict(ring, 8, 1000, KNOWN)
    rd = algorithms.by_name("allreduce_recursive_doubling")
    assert executor_model.predict(rd, 4, 1000, c) == executor_model.predict(rd, 4, 1000, KNOWN)


def test_fit_corrections_recovers_known_factors():
    """Times from KNOWN with all_gather's direct schedule at 8 ranks at 0.3x latency and 2x bandwidth:
    the constants are kept, that algorithm's factors come back, every other's are 1."""
    want = {"allgather_direct": {"latency": 0.3, "bandwidth": 2.0}}
    truth = with_corrections(KNOWN, {"8": want})
    section, notes = executor_model.fit_corrections(records(truth), {"cuda_ipc": KNOWN})
    assert notes == []
    got = section["cuda_ipc"]
    assert {k: got[k] for k in KNOWN} == KNOWN
    assert set(got["corrections"]) == {"2", "4", "8"}
    one = {"latency": 1.0, "bandwidth": 1.0}
    for world, per_algo in got["corrections"].items():
        for name, c in per_algo.items():
            expect = want.get(name, one) if world == "8" else one
            assert c["latency"] == pytest.approx(expect["latency"], rel=1e-6), (world, name)
            assert c["bandwidth"] == pytest.approx(expect["bandwidth"], rel=1e-6), (world, name)
    # the whole fit moves the constants towards the distorted times; the corrections against those still
    # choose what the times choose at every point
    recs = records(truth)
    consts, _ = executor_model.fit(recs)
    assert fit.mean_regret(executor_model.regret(recs, consts), "cuda_ipc") == pytest.approx(1.0)


def test_corrections_follow_their_constants():
    """Corrections belong to the constants they were fitted against: where the fit takes new constants,
    the base's corrections at world sizes not measured are dropped; where it keeps them, they stay."""
    base = {"cuda_ipc": with_corrections(executor_model.DEFAULT["cuda_ipc"],
                                         {"16": {"allgather_ring": {"latency": 2.0, "bandwidth": 2.0}}})}
    taken, _ = executor_model.fit(records(worlds=(2, 4)), base)
    assert consts_of(taken) == pytest.approx(KNOWN) and set(taken["cuda_ipc"]["corrections"]) == {"2", "4"}
    kept, _ = executor_model.fit(records(worlds=(4,)), base)
    assert set(kept["cuda_ipc"]["corrections"]) == {"4", "16"}
    # the fit that took new constants says which world sizes' corrections it dropped
    _, notes = executor_model.fit(records(worlds=(2, 4)), base)
    assert any("cuda_executor cuda_ipc: new constants" in n and "world size(s) 16 " in n for n in notes), notes


def test_corrections_of_algorithms_not_measured_stay():
    """Records of one collective refit that collective's algorithms at that world size; the other
    algorithms' corrections there stay (the constants are kept)."""
    only = [r for r in records(worlds=(4,)) if r["collective"] == "all_reduce"]
    section, _ = executor_model.fit_corrections(only)
    shipped = executor_model.DEFAULT["cuda_ipc"]["corrections"]["4"]
    got = section["cuda_ipc"]["corrections"]["4"]
    assert set(got) == set(shipped)
    for name in got:
        if name.startswith("allreduce_"):
            assert got[name] != shipped[name], name
        else:
            assert got[name] == shipped[name], name


def test_constants_are_a_copy():
    """Changing what constants() gives, corrections included, leaves the shipped default alone."""
    c = executor_model.constants(None)
    before = json.dumps(executor_model.DEFAULT, sort_keys=True)
    c["cuda_ipc"]["corrections"]["8"]["allgather_direct"]["latency"] = 123.0
    c["cuda_ipc"]["alpha_s"] = 1.0
    assert json.dumps(executor_model.DEFAULT, sort_keys=True) == before


def test_shipped_corrections_name_their_constants():
    """The shipped corrections were fitted against the shipped constants; the file names them, and they
    must be the ones in the code (new constants need new corrections: benchmarks/executor_corrections.py)."""
    with open(executor_model.SHIPPED_CORRECTIONS) as f:
        shipped = json.load(f)
    in_code = {m: {k: c[k] for k in executor_model.KEYS} for m, c in executor_model.DEFAULT.items()}
    assert shipped["constants"] == in_code


def consts_of(section):
    return {k: section["cuda_ipc"][k] for k in KNOWN}


def test_fit_corrections_degrades_with_a_warning():
    """A point alone cannot give two factors: they stay 1.0, and a warning names the algorithm."""
    one = [r for r in records(worlds=(4,), sizes=(8192,)) if r["collective"] == "all_reduce"]
    section, notes = executor_model.fit_corrections(one, {"cuda_ipc": KNOWN})
    assert section["cuda_ipc"]["corrections"]["4"]["allreduce_ring"] == {"latency": 1.0, "bandwidth": 1.0}
    assert any("world 4 allreduce_ring" in n and "cannot determine" in n for n in notes), notes


def test_shipped_corrections_turn_the_tables_at_8_ranks():
    """The shipped default carries corrections at 2, 4 and 8 ranks for both memories. At 8 ranks over
    host memory, the constants alone price all_gather's direct schedule above recursive doubling at
    every small size (the steps * p term), which measured 1.7-3.6x slower there; the corrected table
    picks direct."""
    for m in executor_model.MEMORIES:
        assert set(executor_model.DEFAULT[m]["corrections"]) == {"2", "4", "8"}
    plain = executor_model.CONSTANTS
    corrected = executor_model.build_tables(8, {}, selector.DEFAULT_PROFILE)["host_mapped"]["all_gather"]
    alone = executor_model.build_tables(8, {}, {"cuda_executor": plain})["host_mapped"]["all_gather"]
    assert selector.lookup(alone, 128).name == "allgather_recursive_doubling"
    assert selector.lookup(corrected, 128).name == "allgather_direct"
