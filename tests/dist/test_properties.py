"""Property-based: random calls of the Python API over tilecomm, against Gloo and the closed form.

Hypothesis runs in the test process (derandomized, a bounded number of
examples) and draws a call: collective, shape (0-dim, empty, odd, a few
slot-sized), dtype, ReduceOp, root, all_to_all split sizes, data salt, and
whether tilecomm's tensors are strided views (Gloo's stay contiguous). Every
rank of a 3-rank pool runs it (cases.property_call), over tilecomm and over
its Gloo group. The result must equal the closed form and Gloo's (bit for bit:
the data are small integers, exact in every dtype), or tilecomm must raise the
clear error the call deserves; never a crash or a hang (each call is bounded
by the pool's timeout, and a failed group fails the test).
"""

from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import cases

WORLD = 3
CALL_TIMEOUT_S = 30
COLLECTIVES = ["all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single", "gather", "scatter"]

dims = st.lists(st.integers(0, 3), max_size=2)  # trailing dimensions, small: 0 and odd included
first_dim = st.integers(0, 9) | st.integers(1_000, 40_000)  # up to several 64 KiB slots


@st.composite
def calls(draw):
    coll = draw(st.sampled_from(COLLECTIVES))
    zero_dim = draw(st.booleans()) if coll != "all_to_all_single" else False
    shape = () if zero_dim and draw(st.integers(0, 5)) == 0 else (draw(first_dim), *draw(dims))
    splits = None
    if coll == "all_to_all_single":
        shape = (0, *shape[1:])  # rows come from the splits
        rows = st.integers(0, 5) | st.integers(0, 3000)
        splits = draw(st.lists(st.lists(rows, min_size=WORLD, max_size=WORLD), min_size=WORLD, max_size=WORLD))
    return {
        "coll": coll,
        "shape": shape,
        "dtype": draw(st.sampled_from(list(cases.DTYPES))),
        "op": draw(st.sampled_from(cases.OPS)),
        "root": draw(st.integers(0, WORLD - 1)),
        "splits": splits,
        "salt": draw(st.integers(0, 1000)),
        "strided": draw(st.booleans()),  # tilecomm's tensors not contiguous (CPU collectives take them)
    }


@settings(max_examples=150, derandomize=True, deadline=None, database=None, print_blob=True,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: a failed group costs a new pool per step
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(call=calls())
def test_random_calls_match_gloo_and_closed_form(pools, call):
    res = pools.run(WORLD, {}, "property_call", timeout=CALL_TIMEOUT_S, **call)
    problems = [p for r in res for p in r["problems"]]
    assert not problems, "\n".join(problems)
    errors = {r["tilecomm"] for r in res}
    assert len(errors) == 1, f"ranks disagree on whether {call} fails: {errors}"
    gloo = "ran" if res[0]["gloo"] is None else "raised" if res[0]["gloo"] != "not run" else "not run"
    event(f"tilecomm {'raised' if res[0]['tilecomm'] else 'ran'}, gloo {gloo}")  # --hypothesis-show-statistics
    event(f"strided {call['strided']}")
