"""Run under ``mpiexec -n 2``: the two processes call collectives that disagree (issue 24's
cases: another primitive, shape, dtype or size, under jit too), each time catching the
CollectiveMismatchError that every process must raise, and writing the messages to
``DIR/R.json`` (``sys.argv[1]``; the launcher may interleave the processes' output); after each, a matching psum shows that the processes are still in
step. Then collectives over non-array leaves raise TypeError on every process. Prints
``ok R``."""
import json
import os
import sys

import numpy as np

import cuvmap as cv
from cuvmap import distributed, lax

group = distributed.initialize()
R = group.rank

CASES = {
    "op": lambda: lax.psum(np.array([1.0, 5, -2]), "batch") if R == 0 else lax.pmax(np.array([3.0, 1, 4]), "batch"),
    "shape": lambda: lax.psum(np.ones((2, 3)) if R == 0 else np.ones((3, 2)), "batch"),
    "dtype": lambda: lax.psum(np.ones(4) if R == 0 else np.ones(8, np.float32), "batch"),
    "int": lambda: lax.psum(np.ones(4) if R == 0 else np.ones(4, np.int64), "batch"),
    "size": lambda: lax.psum(np.ones(3) if R == 0 else np.ones(4), "batch"),
}
messages = {}
after = distributed.data_parallel(lambda: lax.psum(np.ones(2), "batch"))
for name, case in CASES.items():
    for how, fn in (("eager", case), ("jit", cv.jit(case))):
        try:
            out = distributed.data_parallel(fn)()
        except distributed.CollectiveMismatchError as err:
            messages[f"{name} {how}"] = str(err)
        else:
            raise AssertionError(f"case {name} ({how}): no error on process {R}, got {out}")
        assert np.array_equal(after(), [2.0, 2.0])

LEAVES = {
    "psum": lambda: lax.psum({"a": np.ones(3), "b": "s"}, "batch"),
    "all_gather": lambda: lax.all_gather("s", "batch"),
    "pmax": lambda: lax.pmax(object(), "batch"),
    "ppermute": lambda: lax.ppermute("s", "batch", [(0, 1)]),
}
for name, call in LEAVES.items():
    for fn in (call, cv.jit(call)):
        try:
            distributed.data_parallel(fn)()
        except TypeError as err:
            assert f"{name}: Argument" in str(err) and "is not a valid cuvmap type" in str(err), str(err)
        else:
            raise AssertionError(f"{name} of a non-array leaf returned")
with open(os.path.join(sys.argv[1], f"{R}.json"), "w") as fh:
    json.dump(messages, fh)
print(f"ok {R}", flush=True)
