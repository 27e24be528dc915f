"""tilecomm.tune's offline parts (no ranks spawned): raw points, validation report, command line;
and the model lines of tilecomm.plot."""

import json

import pytest

from tilecomm import algorithms, plot, selector, tune


def _fake_results(world, coll, times_by_name, auto, sizes):
    per = {name: [[n, t] for n, t in zip(sizes, ts)] for name, ts in times_by_name.items()}
    per["auto"] = [[n, t] for n, t in zip(sizes, auto)]
    return {"world": world, "collectives": {coll: per}}


def test_raw_points_merge_worlds():
    results = [
        {
            "world": 2,
            "links": {"shm": [[8, 1e-5]]},
            "reduce": {"float32": [[8, 1e-6]]},
            "collectives": {
                "all_reduce": {"allreduce_ring": [[8, 2e-5]]},
                "barrier": {"barrier_dissemination": [[0, 1e-5]]},
            },
        },
        {"world": 4, "collectives": {"all_reduce": {"allreduce_ring": [[8, 4e-5]]}}},
    ]
    pts = tune.raw_points(results)
    assert pts["links"] == {"shm": [[8, 1e-5]]} and pts["reduce"] == {"float32": [[8, 1e-6]]}
    assert pts["collectives"] == {
        "2": {"allreduce_ring": [[8, 2e-5]], "barrier_dissemination": [[0, 1e-5]]},
        "4": {"allreduce_ring": [[8, 4e-5]]},
    }


def test_validation_rows():
    prof = selector.DEFAULT_PROFILE
    sizes = [8, 1 << 20]
    table = selector.build_table("broadcast", 4, {}, prof)
    names = [a.name for a in algorithms.for_collective("broadcast")]
    chosen = [selector.lookup(table, n).name for n in sizes]
    # Measured = predicted x 2 for every algorithm, except the one picked at 1 MiB, which is made slowest.
    times = {}
    for name in names:
        a = algorithms.by_name(name)
        times[name] = [2 * selector.predict_algo(a, 4, n, prof).total_s for n in sizes]
    times[chosen[1]][1] *= 10
    fastest_at_1m = min(names, key=lambda nm: times[nm][1])
    # The auto group's own run at 8 B caught a hiccup: it shows in the auto-run column, not in the
    # regret, which compares the chosen algorithm's forced time with the fastest.
    auto = [3 * times[chosen[0]][0], times[chosen[1]][1]]
    (row,) = tune.validation_rows([_fake_results(4, "broadcast", times, auto, sizes)], prof)
    assert (row["collective"], row["world"], row["sizes"], row["algorithms"]) == ("broadcast", 4, 2, len(names))
    assert row["picked_fastest"] == 1  # at 8 B the model's ranking holds; at 1 MiB its pick is slowest
    assert row["regret_median"] == pytest.approx((1 + auto[1] / times[fastest_at_1m][1]) / 2)
    assert row["regret_worst"] == pytest.approx(auto[1] / times[fastest_at_1m][1])
    assert row["regret_mean"] == pytest.approx(row["regret_median"])  # two sizes
    assert row["auto_run_median"] == pytest.approx((3 + auto[1] / times[fastest_at_1m][1]) / 2)
    assert row["error_median"] == pytest.approx(0.5)  # predicted = measured / 2
    assert row["error_worst"] == pytest.approx(1 - 1 / 20)
    md = tune.validation_markdown([row], "p")
    assert "| broadcast | 4 | 2 |" in md


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--world-sizes", "1,2"], "world sizes must be >= 2"),
        (["--world-sizes", "two"], "comma-separated integers"),
        (["--collectives", "allreduce"], "unknown collective 'allreduce'"),
        (["--dtypes", "float8"], "unknown dtype 'float8'"),
        (["-b", "64", "-e", "8"], "1 <= -b <= -e"),
        (["-f", "1"], "-f >= 2"),
        (["-r", "0"], "-r >= 1"),
    ],
)
def test_bad_arguments(capsys, argv, match):
    with pytest.raises(SystemExit) as e:
        tune.main(argv)
    assert e.value.code == 2
    assert match in capsys.readouterr().err


def test_validate_rejects_a_bad_profile_before_spawning(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"links": {}}')
    with pytest.raises(SystemExit, match="missing or empty 'links'"):
        tune.main(["--validate", str(bad), "--world-sizes", "2"])


def test_parser_defaults():
    args = tune.build_parser().parse_args([])
    assert args.world_sizes == [2, 4, 8]
    assert args.collectives == algorithms.COLLECTIVES
    assert args.dtypes == tune.REDUCE_DTYPES
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (8, 16 << 20, 4)
    assert args.validate is None
    assert tune.build_parser().parse_args(["--validate"]).validate == ""


def test_summary_lists_constants_and_corrections():
    prof = dict(selector.DEFAULT_PROFILE, corrections={"2": {"allreduce_ring": {"latency": 0.25, "bandwidth": 0.5}}})
    text = tune.summary(prof)
    assert "shm: alpha 4 us, beta 0.5 ns/B" in text
    assert "| allreduce_ring | 0.25 | 0.5 |" in text


def test_plot_model_series_predicts_each_forced_algorithm():
    recs = [
        {"collective": "all_reduce", "backend": "tilecomm:ring", "world": 4, "bytes": n, "dtype": "float"}
        for n in (1024, 8, 0)
    ] + [
        {"collective": "all_reduce", "backend": "tilecomm", "world": 4, "bytes": 8, "dtype": "float"},
        {"collective": "all_reduce", "backend": "gloo", "world": 4, "bytes": 8, "dtype": "float"},
        {"collective": "all_reduce", "backend": "tilecomm:no_such_algo", "world": 4, "bytes": 8, "dtype": "float"},
    ]
    prof = dict(selector.DEFAULT_PROFILE, corrections={"4": {"allreduce_ring": {"latency": 0.5, "bandwidth": 2.0}}})
    series = plot.model_series(recs, prof)
    assert list(series) == [("all_reduce", "tilecomm:ring", 4)]
    ring = algorithms.by_name("allreduce_ring")
    pts = series[("all_reduce", "tilecomm:ring", 4)]
    assert [p[0] for p in pts] == [8, 1024]
    for n, busbw, t_us in pts:
        t = selector.predict_algo(ring, 4, n, prof).total_s
        assert t_us == pytest.approx(t * 1e6)
        assert busbw == pytest.approx(n / t / 1e9 * 2 * 3 / 4)


def test_validation_totals_count_only_points_with_a_choice():
    def row(coll, world, sizes, algos, err, mean, worst, picked):
        return {"collective": coll, "world": world, "sizes": sizes, "algorithms": algos, "error_median": err,
                "error_worst": err, "regret_mean": mean, "regret_median": mean, "regret_worst": worst,
                "auto_run_median": 1.0, "picked_fastest": picked}

    rows = [row("all_reduce", 2, 3, 7, 0.1, 1.2, 1.5, 1), row("gather", 4, 1, 2, 0.3, 1.0, 1.0, 1),
            row("barrier", 4, 1, 1, 0.2, 1.0, 1.0, 1)]
    t = tune.validation_totals(rows)
    assert t["points"] == 4 and t["picked_fastest"] == 2
    assert t["regret_mean"] == pytest.approx((3 * 1.2 + 1.0) / 4)
    assert t["regret_mean_by_world"] == pytest.approx({2: 1.2, 4: 1.0})
    assert t["regret_worst"] == 1.5
    assert t["error_median"] == pytest.approx(0.2)  # of every row's median
    assert "Over the 4 points with a choice: regret mean 1.150 (1.200 / 1.000 at world sizes 2 / 4)" in (
        tune.validation_markdown(rows, "p"))
    assert tune.validation_totals([rows[2]]) == {}


def test_choice_floor_is_the_best_fixed_choice_across_runs():
    sizes = [8, 32, 32]  # sizes that round alike repeat: points are told apart by position
    # run 1: a is fastest everywhere; run 2: b is at the first point (a takes 3x), a at the others
    one = _fake_results(4, "gather", {"a": [1.0, 1.0, 1.0], "b": [2.0, 1.5, 1.0]}, [1.0] * 3, sizes)
    two = _fake_results(4, "gather", {"a": [3.0, 1.0, 1.0], "b": [1.0, 3.0, 1.0]}, [1.0] * 3, sizes)
    solo = _fake_results(4, "barrier", {"only": [1.0] * 3}, [1.0] * 3, sizes)  # no choice: left out
    two_only = _fake_results(2, "gather", {"a": [1.0] * 3, "b": [9.0] * 3}, [1.0] * 3, sizes)  # not in run 1
    floor, left_out = tune.choice_floor([[one, solo], [two, solo, two_only]])
    # point 1: a scores (1, 3), b (2, 1): worst min(3, 2) = 2 (b), mean min(2, 1.5) = 1.5 (b);
    # point 2: a (1, 1); point 3: both (1, 1)
    assert floor == {4: {"points": 3, "regret_mean": pytest.approx((1.5 + 1 + 1) / 3), "regret_worst": 2.0}}
    assert left_out == 3  # world 2's points, measured in one run only
    assert tune.choice_floor([[one]]) == ({4: {"points": 3, "regret_mean": 1.0, "regret_worst": 1.0}}, 0)
    # another size grid, or another set of algorithms: the points are not paired, and said to be left out
    other = _fake_results(4, "gather", {"a": [1.0, 1.0, 1.0], "b": [9.0] * 3}, [1.0] * 3, [8, 32, 128])
    fewer = _fake_results(4, "gather", {"a": [1.0, 1.0, 1.0], "c": [1.0] * 3, "b": [9.0] * 3}, [1.0] * 3, sizes)
    assert tune.choice_floor([[one], [other]]) == ({4: {"points": 2, "regret_mean": 1.0, "regret_worst": 1.0}}, 2)
    assert tune.choice_floor([[one], [fewer]]) == ({}, 3)


def test_validate_measured_scores_an_earlier_report_without_running(tmp_path, capsys):
    prof = selector.DEFAULT_PROFILE
    sizes = [8, 1 << 20]
    names = [a.name for a in algorithms.for_collective("broadcast")]
    times = {nm: [2 * selector.predict_algo(algorithms.by_name(nm), 4, n, prof).total_s for n in sizes]
             for nm in names}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"profile": "x", "rows": [],
                                  "measured": [_fake_results(4, "broadcast", times, times[names[0]], sizes)]}))
    assert tune.main(["--validate", "", "--measured", str(report), "--world-sizes", "4"]) == 0
    out = capsys.readouterr().out
    assert "| broadcast | 4 | 2 |" in out and "Over the 2 points with a choice" in out
    assert "Across the" not in out  # one run: no floor
    assert tune.main(["--validate", "", "--measured", str(report), str(report)]) == 0
    out = capsys.readouterr().out
    assert f"Run 2: {report}" in out and "Across the 2 runs" in out
    assert "| 4 | 2 | 1.000 / 1.00 |" in out  # the same times twice: the floor is each run's best
    with pytest.raises(SystemExit) as e:
        tune.main(["--validate", "", "--measured", str(report), "--json", str(tmp_path / "r.json")])
    assert e.value.code == 2
    report.write_text(json.dumps({"measured": [{"world": 4, "collectives": {"broadcast": {"no_such": [[8, 1.0]]}}}]}))
    with pytest.raises(SystemExit, match="do not fit this version's algorithms"):
        tune.main(["--validate", "", "--measured", str(report)])
    report.write_text("{}")
    with pytest.raises(SystemExit, match="not a --validate --json report"):
        tune.main(["--validate", "", "--measured", str(report)])
    with pytest.raises(SystemExit) as e:
        tune.main(["--measured", str(report)])
    assert e.value.code == 2


def test_a_point_is_the_least_loop_time_over_the_passes(monkeypatch):
    """Each pass keeps the loop's time per call (time_case's first figure), not the median call, and
    the point is the least over the passes."""
    import argparse

    import torch

    from tilecomm import bench

    loops = iter([5e-6, 3e-6, 4e-6, 5e-6, 4e-6, 3e-6])  # pass by pass; which algorithm goes first takes turns
    monkeypatch.setattr(bench, "_algo_groups", lambda coll, spec, world: {"tilecomm:binomial_tree": "g1",
                                                                         "tilecomm:pipelined_chain": "g2"})
    monkeypatch.setattr(bench, "Case", lambda coll, n, *a: argparse.Namespace(nbytes=n))
    monkeypatch.setattr(bench, "time_case", lambda case, iters, warmup, timing: (next(loops), torch.full((iters,), 1e-3)))
    monkeypatch.setattr(tune.dist, "destroy_process_group", lambda g: None)
    args = argparse.Namespace(collectives=["broadcast"], minbytes=8, maxbytes=8, stepfactor=4, repeats=3, iters=4,
                              warmup=0)
    out = tune._time_algorithms(0, 2, args, None)
    # binomial_tree goes first in passes 1 and 3: it gets 5, 5, 4 us; pipelined_chain 3, 4, 3
    assert out == {"broadcast": {"broadcast_binomial_tree": [[8, 4e-6]], "broadcast_pipelined_chain": [[8, 3e-6]]}}


def test_passes_sweep_every_size_before_the_next_pass(monkeypatch):
    """A pass times every size (each with every algorithm) before the next pass starts, so the
    passes of one point are a sweep apart; the algorithms take turns at going first; each point is
    still the least over its passes."""
    import argparse

    import torch

    from tilecomm import bench

    calls = []

    def time_case(case, iters, warmup, timing):
        calls.append((case.nbytes, case.group))
        return 1e-6 * (len(calls) % 4 + 1), torch.zeros(iters)

    monkeypatch.setattr(bench, "_algo_groups", lambda coll, spec, world: {"tilecomm:binomial_tree": "g1",
                                                                         "tilecomm:pipelined_chain": "g2"})
    monkeypatch.setattr(bench, "Case", lambda coll, n, dtype, op, rank, world, g: argparse.Namespace(nbytes=n, group=g))
    monkeypatch.setattr(bench, "time_case", time_case)
    monkeypatch.setattr(tune.dist, "destroy_process_group", lambda g: None)
    args = argparse.Namespace(collectives=["broadcast"], minbytes=8, maxbytes=128, stepfactor=4, repeats=2, iters=4,
                              warmup=0)
    out = tune._time_algorithms(0, 2, args, None)
    assert calls == [(8, "g1"), (8, "g2"), (32, "g1"), (32, "g2"), (128, "g1"), (128, "g2"),
                     (8, "g2"), (8, "g1"), (32, "g2"), (32, "g1"), (128, "g2"), (128, "g1")]
    # call k (from 1) took (k % 4 + 1) us; a point keeps the least of its two calls
    expected = {}
    for k, key in enumerate(calls, 1):
        expected[key] = min(expected.get(key, 1.0), 1e-6 * (k % 4 + 1))
    assert out == {"broadcast": {
        "broadcast_binomial_tree": [[n, expected[(n, "g1")]] for n in (8, 32, 128)],
        "broadcast_pipelined_chain": [[n, expected[(n, "g2")]] for n in (8, 32, 128)],
    }}
