"""python -m tilecomm.explain: the decision table and the per-candidate breakdown it prints."""

import json
import re

import pytest

from tilecomm import algorithms, executor_model, explain, selector


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("TILECOMM_PROFILE", raising=False)
    monkeypatch.delenv("TILECOMM_ALGO", raising=False)


def run(capsys, *argv):
    assert explain.main(list(argv)) == 0
    return capsys.readouterr().out


def test_format_bytes():
    assert explain.format_bytes(0) == "0 B"
    assert explain.format_bytes(513) == "513 B"
    assert explain.format_bytes(1024) == "1 KiB"
    assert explain.format_bytes(3 << 20) == "3 MiB"
    assert explain.format_bytes((1 << 20) + 1) == "1048577 B"


def test_prints_the_decision_table(capsys):
    out = run(capsys, "--collective", "all_reduce", "--world-size", "8")
    assert out.startswith("profile: default (shipped)")
    rows = re.findall(r"^  (\S+ \S+) \.\. (\S+(?: \S+)?)\s+(\w+)$", out, re.M)
    table = selector.build_table("all_reduce", 8, {})
    assert [r[2] for r in rows] == [algorithms.ALGORITHMS[aid].name for _, aid in table]
    assert rows[0][0] == "0 B" and rows[-1][1] == "inf"
    assert "predicted us" not in out  # no --size, no breakdown


def test_size_breaks_down_every_candidate(capsys):
    out = run(capsys, "--collective", "all_reduce", "--world-size", "8", "--size", "1MB")
    assert "all_reduce of 1 MiB (1048576 B), world size 8, float32" in out
    lines = [line for line in out.splitlines() if re.match(r"^  [* ] allreduce_", line)]
    cands = algorithms.for_collective("all_reduce")
    assert len(lines) == len(cands)
    totals = []
    for line in lines:
        _mark, name, total, lat, bw, red = re.match(
            r"^  ([* ]) (\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line
        ).groups()
        pr = selector.predict_algo(algorithms.by_name(name), 8, 1 << 20, selector.DEFAULT_PROFILE)
        assert float(lat) == pytest.approx(pr.latency_s * 1e6, abs=0.01)
        assert float(bw) == pytest.approx(pr.bandwidth_s * 1e6, abs=0.01)
        assert float(red) == pytest.approx(pr.reduction_s * 1e6, abs=0.01)
        assert float(total) == pytest.approx(pr.total_s * 1e6, abs=0.01)
        totals.append(float(total))
    assert totals == sorted(totals)
    marked = [line for line in lines if line.startswith("  *")]
    picked = selector.lookup(selector.build_table("all_reduce", 8, {}), 1 << 20)
    assert len(marked) == 1 and picked.name in marked[0]
    assert lines[0].startswith("  *")  # the table's pick is the model's fastest at float32


def test_hosts_price_inter_host_traffic_as_tcp(capsys):
    """On 2 hosts the model charges TCP's alpha and beta for what crosses hosts:
    hierarchical (1/G of ring's inter-host bytes) takes over large all_reduces."""
    out = run(capsys, "--collective", "all_reduce", "--world-size", "8", "--hosts", "2", "--size", "16MB")
    assert "world size 8 on 2 hosts" in out
    lines = out.splitlines()
    marked = [line for line in lines if line.startswith("  *") and "allreduce_" in line]
    assert len(marked) == 1 and "allreduce_hierarchical" in marked[0], out
    layout = explain.host_layout(8, 2)
    assert layout == (0, 0, 0, 0, 1, 1, 1, 1) and explain.host_layout(7, 3) == (0, 0, 0, 1, 1, 2, 2)
    ring = selector.predict_algo(algorithms.by_name("allreduce_ring"), 8, 1 << 24, layout=layout)
    flat = selector.predict_algo(algorithms.by_name("allreduce_ring"), 8, 1 << 24)
    assert ring.total_s > flat.total_s  # TCP is dearer than shared memory in the default profile


def test_profile_option_and_setting(capsys, tmp_path, monkeypatch):
    prof = json.loads(json.dumps(selector.DEFAULT_PROFILE))
    prof["name"] = "tree-friendly"
    prof["corrections"] = {"8": {"allreduce_tree": {"latency": 0.01, "bandwidth": 0.01}}}
    path = tmp_path / "p.json"
    selector.save_profile(prof, str(path))
    out = run(capsys, "--collective", "all_reduce", "--world-size", "8", "--profile", str(path))
    assert f"tree-friendly (from {path})" in out and "allreduce_tree" in out
    monkeypatch.setenv("TILECOMM_PROFILE", str(path))
    assert run(capsys, "--collective", "all_reduce", "--world-size", "8") == out


def test_all_collectives(capsys):
    out = run(capsys, "--collective", "all", "--world-size", "4")
    for coll in algorithms.COLLECTIVES:
        assert f"{coll}, world size 4 (decision table, float32):" in out


def test_dtype_note_when_gamma_would_change_the_choice(capsys, tmp_path):
    prof = json.loads(json.dumps(selector.DEFAULT_PROFILE))
    prof["gamma_s_per_byte"]["float16"] = 1e-6  # reductions dominate: fewest reduced bytes wins
    path = tmp_path / "p.json"
    selector.save_profile(prof, str(path))
    out = run(
        capsys,
        "--collective",
        "all_reduce",
        "--world-size",
        "8",
        "--size",
        "64",
        "--dtype",
        "float16",
        "--profile",
        str(path),
    )
    assert "built with float32's gamma" in out


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--collective", "all_reduce", "--world-size", "0"], "--world-size must be >= 1"),
        (["--collective", "all_reduce", "--world-size", "4", "--hosts", "8"], "--hosts must be between"),
        (["--collective", "allreduce", "--world-size", "4"], "invalid choice"),
        (["--collective", "all_reduce", "--world-size", "4", "--profile", "/no/such/profile.json"], "cannot read it"),
        (["--collective", "all_to_all", "--world-size", "4", "--device", "cuda"], "does not run on the schedule"),
        (["--collective", "broadcast", "--world-size", "4", "--hosts", "2", "--device", "cuda"], "staged"),
        (["--collective", "broadcast", "--world-size", "4", "--device", "cuda", "--memory", "nvshmem"],
         "invalid choice"),
        (["--collective", "broadcast", "--world-size", "32", "--device", "cuda"], "over 16 ranks"),
    ],
)
def test_bad_arguments(capsys, argv, match):
    with pytest.raises(SystemExit) as e:
        explain.main(argv)
    assert e.value.code == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("memory", executor_model.MEMORIES)
def test_cuda_prints_the_executors_tables(capsys, memory):
    """--device cuda: the executor's table over the memory, and its candidates' terms at a size."""
    out = run(capsys, "--collective", "gather", "--world-size", "8", "--size", "32K", "--device", "cuda",
              "--memory", memory)
    assert f"gather, world size 8, CUDA tensors (schedule executor over {memory}):" in out
    consts = executor_model.constants(None)[memory]
    table = executor_model.build_table("gather", 8, {}, consts)
    rows = re.findall(r"^  (\S+ \S+) \.\. (\S+(?: \S+)?)\s+(\w+)$", out, re.M)
    assert [r[2] for r in rows] == [algorithms.ALGORITHMS[aid].name for _, aid in table]
    lines = [line for line in out.splitlines() if re.match(r"^  [* ] gather_", line)]
    assert len(lines) == len(executor_model.candidates("gather"))
    totals = []
    for line in lines:
        name, total, *parts = re.match(r"^  [* ] (\w+)" + r"\s+([\d.]+)" * 5, line).groups()
        algo = algorithms.by_name(name)
        assert float(total) == pytest.approx(executor_model.predict(algo, 8, 32768, consts) * 1e6, abs=0.01)
        assert sum(map(float, parts)) == pytest.approx(float(total), abs=0.05)
        c_lat, c_bw = executor_model.correction(consts, 8, algo)  # the shipped default has them at 8
        assert f"corrected x{c_lat:.3g} / x{c_bw:.3g})" in line and (c_lat, c_bw) != (1.0, 1.0)
        totals.append(float(total))
    assert totals == sorted(totals)
    picked = selector.lookup(table, 32768)
    assert [line for line in lines if line.startswith("  *")] == [line for line in lines if picked.name in line]


def test_cuda_all_notes_the_direct_kernels(capsys):
    out = run(capsys, "--collective", "all", "--world-size", "4", "--device", "cuda")
    for coll in executor_model.COLLECTIVES:
        assert f"{coll}, world size 4, CUDA tensors" in out
    assert "barrier" not in out and "all_to_all" not in out
    assert "TILECOMM_CUDA_ALLREDUCE=scheduled" in out


def _direct_rows(out):
    block = out.split("(direct kernels over")[1].split("\n\n")[0]
    return re.findall(r"^  (\S+ \S+) \.\. (\S+(?: \S+)?)\s+(allreduce_\w+)$", block, re.M)


def test_cuda_all_reduce_shows_the_direct_kernels(capsys, monkeypatch):
    """--device cuda, all_reduce: the direct kernels' ranges at the CUDA model's crossovers, and each
    kernel's prediction at --size; a TILECOMM_CUDA_TWO_SHOT_BYTES setting moves them."""
    from tilecomm import cuda_model

    for key in ("TILECOMM_CUDA_TWO_SHOT_BYTES", "TILECOMM_LL_BYTES", "TILECOMM_CUDA_ALLREDUCE", "TILECOMM_PROTO"):
        monkeypatch.delenv(key, raising=False)
    out = run(capsys, "--collective", "all_reduce", "--world-size", "4", "--size", "64K", "--device", "cuda")
    t = cuda_model.thresholds(None, 4)["cuda_ipc"]
    rows = _direct_rows(out)
    assert [r[2] for r in rows] == ["allreduce_one_shot_ll", "allreduce_one_shot", "allreduce_two_shot"]
    assert rows[0][1] == explain.format_bytes(t["ll_bytes"]) and rows[2][0] == explain.format_bytes(t["two_shot_bytes"])
    consts = cuda_model.constants(None)
    for k in ("allreduce_one_shot_ll", "allreduce_one_shot", "allreduce_two_shot"):
        got = float(re.search(rf"^    {k}\s+([\d.]+)$", out, re.M).group(1))
        assert got == pytest.approx(cuda_model.predict(k, 4, 65536, consts, "cuda_ipc") * 1e6, abs=0.01)
    assert "registered tensors" in out and "note: TILECOMM" not in out
    assert "captured in a CUDA graph, from 1 MiB (TILECOMM_CUDA_CAPTURE_REGISTER_BYTES)" in out
    monkeypatch.setenv("TILECOMM_CUDA_CAPTURE_REGISTER_BYTES", "0")  # captured calls as eager ones
    assert "captured in a CUDA graph" not in run(capsys, "--collective", "all_reduce", "--world-size", "4",
                                                 "--device", "cuda")
    monkeypatch.setenv("TILECOMM_CUDA_TWO_SHOT_BYTES", "0")
    monkeypatch.setenv("TILECOMM_PROTO", "simple")
    out = run(capsys, "--collective", "all_reduce", "--world-size", "2", "--device", "cuda", "--memory", "host_mapped")
    rows = _direct_rows(out)
    assert [r[2] for r in rows] == ["allreduce_one_shot_ll", "allreduce_two_shot"]
    assert "note: TILECOMM_PROTO=simple is set" in out and "registered tensors" not in out


def test_cuda_ll_range_stops_at_the_ll_buffer(capsys, monkeypatch):
    """TILECOMM_LL_BYTES above the LL buffer: LL still runs only up to the buffer (as the CUDA side caps it)."""
    from tilecomm import cuda_model

    monkeypatch.setenv("TILECOMM_LL_BYTES", str(4 * cuda_model.LL_MAX_BYTES))
    monkeypatch.setenv("TILECOMM_CUDA_TWO_SHOT_BYTES", "0")
    rows = _direct_rows(run(capsys, "--collective", "all_reduce", "--world-size", "4", "--device", "cuda"))
    assert rows[0] == ("0 B", explain.format_bytes(cuda_model.LL_MAX_BYTES), "allreduce_one_shot_ll")
    assert rows[1] == (f"{cuda_model.LL_MAX_BYTES + 1} B", "inf", "allreduce_two_shot")


def test_cuda_shows_nvshmems_kernels(capsys):
    """--device cuda, all_gather and reduce_scatter: where pull replaces push (cuda_model.nvshmem_thresholds)
    and, at --size, each kernel's prediction with its corrections at the world size."""
    from tilecomm import cuda_model

    out = run(capsys, "--collective", "all_gather", "--world-size", "2", "--size", "1M", "--device", "cuda")
    block = out.split("(NVSHMEM's kernels")[1].split("\n\n")[0]
    assert re.findall(r"^  (\S+ \S+) \.\. (\S+)\s+(\w+)$", block, re.M) == [("0 B", "inf", "allgather_nvshmem_pull")]
    consts = cuda_model.constants(None)
    rows = re.findall(r"^    (allgather_nvshmem_\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)  (.*)$", out, re.M)
    assert [r[0] for r in rows] == ["allgather_nvshmem_pull", "allgather_nvshmem_push"]  # fastest first
    for k, total, _, _, note in rows:
        assert float(total) == pytest.approx(cuda_model.predict(k, 2, 1 << 20, consts, "nvshmem") * 1e6, abs=0.01)
        assert note.startswith("x")
    out = run(capsys, "--collective", "reduce_scatter", "--world-size", "8", "--size", "4K", "--device", "cuda")
    assert "none at this world size" in out
    n = cuda_model.nvshmem_thresholds(None, 8)["reduce_scatter_pull_bytes"]
    want = "reducescatter_nvshmem_pull" if n == 0 else "reducescatter_nvshmem_push"
    assert re.search(rf"^  0 B \.\. \S+\s+{want}$", out, re.M)
