"""tilecomm.cuda_model: the CUDA kernels' cost model, its fit to gpu_latency records, and the thresholds."""

import json

import pytest

from tilecomm import cuda_model, selector

KNOWN = {
    "cuda_ipc": {
        "ll": {"alpha_s": 4e-6, "alpha_round_s": 0.0, "alpha_peer_s": 1e-6, "beta_s_per_byte": 2e-12},
        "simple": {"alpha_s": 3e-6, "alpha_round_s": 2e-6, "alpha_peer_s": 2e-6, "beta_s_per_byte": 1e-12},
    },
    "host_mapped": {
        "ll": {"alpha_s": 8e-6, "alpha_round_s": 0.0, "alpha_peer_s": 3e-6, "beta_s_per_byte": 4e-10},
        "simple": {"alpha_s": 5e-6, "alpha_round_s": 3e-6, "alpha_peer_s": 4e-6, "beta_s_per_byte": 5e-11},
    },
    # No LL kernel runs over NVSHMEM (its LL constants stay the default's); the block kernels all take
    # one round, so alpha_round cannot be told from alpha and stays 0.
    "nvshmem": {
        "ll": cuda_model.DEFAULT["nvshmem"]["ll"],
        "simple": {"alpha_s": 6e-6, "alpha_round_s": 0.0, "alpha_peer_s": 3e-6, "beta_s_per_byte": 3e-12},
    },
}
ENTRIES = {"ll": "allreduce_one_shot_ll", "one_shot": "allreduce_one_shot", "two_shot": "allreduce_two_shot"}
FITTED = [(m, pr) for m in cuda_model.MEMORIES for pr in cuda_model.PROTOCOLS if (m, pr) != ("nvshmem", "ll")]


def records(consts, worlds=(2, 4), sizes=(8, 1024, 65536, 1 << 20), noise=0.0):
    """gpu_points-style records whose graph times (NVSHMEM kernels': eager times, as tune measures them)
    follow `consts` exactly (times in microseconds)."""
    out = []
    for p in worlds:
        for i, n in enumerate(sizes):
            r = {"world": p, "bytes": n, "kernels": {}, "memory": {}}
            for prefix, memory in (("", "cuda_ipc"), ("hm_", "host_mapped")):
                for entry, kernel in ENTRIES.items():
                    key = f"all_reduce:{prefix}{entry}"
                    wobble = 1 + noise * (-1) ** (i + len(entry))
                    r[f"{key}:graph"] = cuda_model.predict(kernel, p, n, consts, memory) * 1e6 * wobble
                    r["kernels"][key] = kernel
                    r["memory"][f"{prefix}{entry}"] = memory
            for kernel, k in cuda_model.FORCEABLE.items():  # all_gather:nvshmem_push, ...
                key = f"{k.collective}:{kernel.split('_', 1)[1]}"
                r[f"{key}:eager"] = cuda_model.predict(kernel, p, n, consts, "nvshmem") * 1e6 * (1 + noise * (-1) ** i)
                r["kernels"][key] = kernel
                r["memory"][kernel.split("_", 1)[1]] = "nvshmem"
                r[f"all_reduce:{prefix}ll:eager"] = 40.0  # eager times are not fitted
            out.append(r)
    return out


def test_fit_recovers_known_constants():
    consts, notes = cuda_model.fit(records(KNOWN))
    assert len(notes) == 1 and "nvshmem ll" in notes[0]
    for m, pr in FITTED:
        for key, want in KNOWN[m][pr].items():
            assert consts[m][pr][key] == pytest.approx(want, rel=1e-6, abs=1e-15), (m, pr, key)
        assert consts[m][pr]["fit"]["median_error"] < 1e-9


def test_fit_with_noise_stays_close():
    consts, _ = cuda_model.fit(records(KNOWN, sizes=(8, 64, 1024, 16384, 262144, 1 << 20), noise=0.05))
    for m, pr in FITTED:
        c = consts[m][pr]
        assert c["fit"]["median_error"] < 0.1
        for n in (8, 4096, 1 << 20):
            for p in (2, 4):
                k = "allreduce_one_shot_ll" if pr == "ll" else "allreduce_one_shot"
                if m == "nvshmem":
                    k = "allgather_nvshmem_push"
                got = cuda_model.predict(k, p, n, consts, m)
                assert got == pytest.approx(cuda_model.predict(k, p, n, KNOWN, m), rel=0.15)


def test_too_few_points_keep_the_defaults():
    one_world = records(KNOWN, worlds=(4,))
    consts, notes = cuda_model.fit(one_world)
    assert len(notes) == 6 and all("kept the defaults" in n for n in notes)
    default = cuda_model.constants(None)
    for m in cuda_model.MEMORIES:
        assert {pr: consts[m][pr] for pr in cuda_model.PROTOCOLS} == {pr: default[m][pr] for pr in cuda_model.PROTOCOLS}
    # NVSHMEM's corrections at the measured world size are fitted against them (the others stay), and
    # each kernel's prediction there comes out as measured: a factor on each part of the formula
    assert consts["nvshmem"]["corrections"]["2"] == default["nvshmem"]["corrections"]["2"]
    for kernel in cuda_model.FORCEABLE:
        for n in (8, 1 << 20):
            got = cuda_model.predict(kernel, 4, n, consts, "nvshmem")
            assert got == pytest.approx(cuda_model.predict(kernel, 4, n, KNOWN, "nvshmem"), rel=1e-6)


def _with_corrections(corrections):
    return {**KNOWN, "nvshmem": {**KNOWN["nvshmem"], "corrections": corrections}}


TRUE_CORRECTIONS = {  # push and pull apart where the formula prices them alike (2 ranks)
    "2": {"allgather_nvshmem_push": {"latency": 1.3, "bandwidth": 1.1},
          "allgather_nvshmem_pull": {"latency": 0.8, "bandwidth": 0.9}},
    "4": {"reducescatter_nvshmem_pull": {"latency": 1.5, "bandwidth": 2.0}},
}


def test_fit_corrections_reproduce_each_kernels_times():
    truth = _with_corrections(TRUE_CORRECTIONS)
    consts, notes = cuda_model.fit(records(truth, sizes=(8, 64, 1024, 65536, 1 << 20)))
    assert len(notes) == 1 and "nvshmem ll" in notes[0]
    assert set(consts["nvshmem"]["corrections"]) == {"2", "4"}  # the default's other world sizes are dropped
    for p in (2, 4):
        for kernel in cuda_model.FORCEABLE:
            assert set(consts["nvshmem"]["corrections"][str(p)][kernel]) == {"latency", "bandwidth"}
            for n in (8, 4096, 1 << 20):
                want = cuda_model.predict(kernel, p, n, truth, "nvshmem")
                assert cuda_model.predict(kernel, p, n, consts, "nvshmem") == pytest.approx(want, rel=1e-6)
        assert cuda_model.nvshmem_thresholds({"cuda": consts}, p) == cuda_model.nvshmem_thresholds({"cuda": truth}, p)
    # at 2 ranks the formula alone cannot tell push from pull (both price as push); the corrections can
    assert cuda_model.nvshmem_thresholds({"cuda": KNOWN}, 2)["all_gather_pull_bytes"] == cuda_model.NEVER
    assert cuda_model.nvshmem_thresholds({"cuda": consts}, 2)["all_gather_pull_bytes"] == 0
    # only NVSHMEM's kernels get corrections
    assert all("corrections" not in consts[m] for m in ("cuda_ipc", "host_mapped"))


def test_new_constants_drop_corrections_of_world_sizes_not_measured():
    base = json.loads(json.dumps(_with_corrections({"8": TRUE_CORRECTIONS["2"]})))
    consts, notes = cuda_model.fit(records(KNOWN), base)
    assert "8" not in consts["nvshmem"]["corrections"]
    assert any("corrections at world size(s) 8" in n and "dropped" in n for n in notes)
    # constants kept as they were (too few points): the corrections of other world sizes stay
    consts, _ = cuda_model.fit(records(KNOWN, worlds=(4,)), base)
    assert consts["nvshmem"]["corrections"]["8"] == TRUE_CORRECTIONS["2"]


def test_nvshmem_thresholds_with_corrections():
    def pull_from(pull):
        return cuda_model.nvshmem_thresholds(
            {"cuda": _with_corrections({"2": {"allgather_nvshmem_pull": pull}})}, 2)["all_gather_pull_bytes"]

    assert pull_from({"latency": 0.5, "bandwidth": 0.5}) == 0  # faster at every size
    assert pull_from({"latency": 2.0, "bandwidth": 2.0}) == cuda_model.NEVER
    # slower below a crossover, faster above it: pull from the first size of the grid past it
    n = pull_from({"latency": 3.0, "bandwidth": 0.5})
    consts = _with_corrections({"2": {"allgather_nvshmem_pull": {"latency": 3.0, "bandwidth": 0.5}}})
    assert n not in (0, cuda_model.NEVER)
    assert cuda_model.predict("allgather_nvshmem_pull", 2, n, consts, "nvshmem") < \
        cuda_model.predict("allgather_nvshmem_push", 2, n, consts, "nvshmem")
    assert cuda_model.predict("allgather_nvshmem_pull", 2, n // 2, consts, "nvshmem") >= \
        cuda_model.predict("allgather_nvshmem_push", 2, n // 2, consts, "nvshmem")
    # faster below a crossover only: one threshold cannot say so, and the larger sizes keep push
    assert pull_from({"latency": 0.5, "bandwidth": 3.0}) == cuda_model.NEVER


def test_corrections_come_with_their_constants():
    assert cuda_model.constants(None)["nvshmem"]["corrections"] == cuda_model.DEFAULT["nvshmem"]["corrections"]
    assert cuda_model.constants({"cuda": {"cuda_ipc": KNOWN["cuda_ipc"]}})["nvshmem"]["corrections"] == \
        cuda_model.DEFAULT["nvshmem"]["corrections"]
    # a profile's own NVSHMEM constants without corrections get none (the default's belong to its constants)
    assert "corrections" not in cuda_model.constants({"cuda": {"nvshmem": KNOWN["nvshmem"]}})["nvshmem"]


def test_samples_skip_failures_staged_auto_and_eager():
    r = records(KNOWN, worlds=(2,), sizes=(8,))[0]
    # 3 forced kernels x 2 memories and 4 NVSHMEM kernels, graph times only
    assert len(cuda_model.samples([r])) == 10
    r["all_reduce:one_shot:graph"] = "failed: something"
    r["kernels"]["all_gather:ll"] = "staged"  # a staged all_gather with a graph time
    r["all_gather:ll:graph"] = 50.0
    r["memory"]["auto"] = "cuda_ipc"  # auto validates the fit; it is not fitted
    r["kernels"]["all_reduce:auto"] = "allreduce_one_shot_ll"
    r["all_reduce:auto:graph"] = 5.0
    r["memory"]["ll_system_fence"] = "cuda_ipc"  # a comparison run with other settings: not fitted
    r["kernels"]["all_reduce:ll_system_fence"] = "allreduce_one_shot_ll"
    r["all_reduce:ll_system_fence:graph"] = 6.0
    got = cuda_model.samples([r])
    assert len(got) == 9, got
    kinds = {(m, k) for m, k, *_ in got}
    assert ("cuda_ipc", "allreduce_one_shot") not in kinds
    assert ("host_mapped", "allreduce_one_shot") in kinds
    want = cuda_model.predict("allreduce_one_shot_ll", 2, 8, KNOWN, "cuda_ipc")
    assert [t for m, k, *_, t in got if (m, k) == ("cuda_ipc", "allreduce_one_shot_ll")] == [pytest.approx(want)]


def test_nvshmem_samples_take_graph_times_where_there_are_any():
    r = records(KNOWN, worlds=(2,), sizes=(8,))[0]
    eager = {k: t for m, k, *_, t in cuda_model.samples([r]) if m == "nvshmem"}
    r["all_gather:nvshmem_push:graph"] = 3.0  # a captured loop: taken instead of the eager time
    r["all_gather:nvshmem_pull:graph"] = "failed: cannot be captured"  # refused: the eager time stays
    r["all_reduce:ll:graph"] = -1.0  # not a time: no sample (cuda_ipc takes no eager time)
    got = {k: t for m, k, *_, t in cuda_model.samples([r]) if m == "nvshmem"}
    assert got["allgather_nvshmem_push"] == pytest.approx(3e-6)
    assert got["allgather_nvshmem_pull"] == pytest.approx(eager["allgather_nvshmem_pull"])
    assert not any(k == "allreduce_one_shot_ll" and m == "cuda_ipc" for m, k, *_ in cuda_model.samples([r]))
    assert cuda_model.kernel_time({"x:graph": True, "x:eager": 2.0}, "x", "nvshmem") == 2.0
    assert cuda_model.kernel_time({"x:eager": 2.0}, "x", "cuda_ipc") is None


def test_thresholds_are_the_model_crossovers():
    prof = {"cuda": KNOWN}
    for p in (2, 3, 4, 8):
        for m, t in cuda_model.thresholds(prof, p).items():
            ll, two = t["ll_bytes"], t["two_shot_bytes"]
            assert 0 <= ll <= cuda_model.LL_MAX_BYTES

            def simple(n):
                k = "allreduce_two_shot" if n >= two else "allreduce_one_shot"
                return cuda_model.predict(k, p, n, KNOWN, m)

            if ll:  # LL wins up to ll ...
                assert cuda_model.predict("allreduce_one_shot_ll", p, ll, KNOWN, m) <= simple(ll)
            if 0 < ll < cuda_model.LL_MAX_BYTES:  # ... and loses at the next size
                assert cuda_model.predict("allreduce_one_shot_ll", p, 2 * ll, KNOWN, m) > simple(2 * ll)
            if two != cuda_model.NEVER:
                n = two
                assert cuda_model.predict("allreduce_two_shot", p, n, KNOWN, m) < cuda_model.predict(
                    "allreduce_one_shot", p, n, KNOWN, m)
    # host memory's LL lines are slow per byte: its LL range ends far below GPU memory's
    t4 = cuda_model.thresholds(prof, 4)
    assert t4["host_mapped"]["ll_bytes"] < t4["cuda_ipc"]["ll_bytes"]


def test_profile_cuda_section_is_checked(tmp_path):
    good = json.loads(json.dumps(selector.DEFAULT_PROFILE))
    good["cuda"] = {"host_mapped": {"ll": KNOWN["host_mapped"]["ll"]}}  # partial: the rest from the default
    path = tmp_path / "p.json"
    path.write_text(json.dumps(good))
    prof = selector.load_profile(str(path))
    assert cuda_model.constants(prof)["host_mapped"]["ll"] == KNOWN["host_mapped"]["ll"]
    assert cuda_model.constants(prof)["cuda_ipc"] == cuda_model.DEFAULT["cuda_ipc"]
    for bad, what in (({"nvlink": {}}, "nvlink"), ({"cuda_ipc": {"ll128": {}}}, "ll128"),
                      ({"cuda_ipc": {"ll": {**KNOWN["cuda_ipc"]["ll"], "alpha_s": -1}}}, "alpha_s"),
                      ({"cuda_ipc": {"ll": {"alpha_s": 1e-6}}}, "alpha_round_s"),
                      ({"nvshmem": {"corrections": {"17": {}}}}, "'17' is not a world size of 1 to 16"),
                      ({"nvshmem": {"corrections": {"2": {"allreduce_one_shot": {"latency": 1, "bandwidth": 1}}}}},
                       "'allreduce_one_shot' is not an algorithm"),
                      ({"nvshmem": {"corrections": {"2": {"allgather_nvshmem_pull": {"latency": 0, "bandwidth": 1}}}}},
                       "factors must be > 0"),
                      ({"cuda_ipc": {"corrections": {"2": {"allgather_nvshmem_pull": {"latency": 1, "bandwidth": 1}}}}},
                       "'allgather_nvshmem_pull' is not an algorithm")):
        good["cuda"] = bad
        path.write_text(json.dumps(good))
        with pytest.raises(ValueError, match=what):
            selector.load_profile(str(path))


def test_tune_cuda_from_writes_a_profile(tmp_path, capsys, monkeypatch):
    from tilecomm import tune

    monkeypatch.delenv("TILECOMM_PROFILE", raising=False)
    recs = records(KNOWN)
    for r in recs:  # an auto entry that picked the LL kernel
        r["all_reduce:auto:graph"] = r["all_reduce:ll:graph"] * 1.1
        r["kernels"]["all_reduce:auto"] = "allreduce_one_shot_ll"
        r["memory"]["auto"] = "cuda_ipc"
    src, out = tmp_path / "lat.jsonl", tmp_path / "prof.json"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert tune.main(["--cuda-from", str(src), "-o", str(out)]) == 0
    prof = selector.load_profile(str(out))
    assert prof["cuda"]["cuda_ipc"]["ll"]["alpha_s"] == pytest.approx(4e-6)
    report = capsys.readouterr().out
    assert "| 4 | host_mapped |" in report and "regret" in report
    regrets = tune.cuda_regret(recs)
    assert {k for k in regrets} == {(2, "all_reduce:auto"), (4, "all_reduce:auto")}
    assert all(r >= 1.0 for rs in regrets.values() for _, r in rs)


def test_nvshmem_thresholds_are_the_model_crossovers():
    for p in (2, 4, 8):
        t = cuda_model.nvshmem_thresholds({"cuda": KNOWN}, p)
        for coll, short in (("all_gather", "allgather"), ("reduce_scatter", "reducescatter")):
            n = t[f"{coll}_pull_bytes"]
            pull = cuda_model.predict(f"{short}_nvshmem_pull", p, n, KNOWN, "nvshmem")
            push = cuda_model.predict(f"{short}_nvshmem_push", p, n, KNOWN, "nvshmem")
            if n == cuda_model.NEVER:
                assert pull >= push
            else:
                assert pull < push
    # pull stages n and reads (p - 1) x n; push stores (p - 1) x n and copies them out again: from 3 ranks,
    # pull moves fewer bytes, and wins once the bytes dominate
    assert cuda_model.nvshmem_thresholds({"cuda": KNOWN}, 4)["all_gather_pull_bytes"] != cuda_model.NEVER
    assert cuda_model.nvshmem_thresholds({"cuda": KNOWN}, 2)["all_gather_pull_bytes"] == cuda_model.NEVER


def test_fitted_constants_whose_thresholds_choose_worse_are_not_taken():
    """two_shot at 0.3x of what KNOWN predicts over GPU memory: the two protocols' fits together move
    the thresholds so that they choose worse on these very points than KNOWN's; that memory keeps the
    current constants, with a warning, and host memory (whose times follow KNOWN) takes its fit."""
    recs = records(KNOWN, sizes=(8, 1024, 16384, 65536, 262144, 1 << 20, 4 << 20))
    for r in recs:
        r["all_reduce:two_shot:graph"] *= 0.3
    consts, notes = cuda_model.fit(recs, KNOWN)
    assert {pr: {k: v for k, v in c.items() if k != "fit"} for pr, c in consts["cuda_ipc"].items()} == KNOWN["cuda_ipc"]
    worse = [n for n in notes if "choose worse" in n]
    assert len(worse) == 1 and worse[0].startswith("cuda cuda_ipc: the fitted constants' thresholds"), notes
    assert all("fit" in consts["host_mapped"][pr] for pr in cuda_model.PROTOCOLS)
