"""Run under ``mpiexec -n 2`` (tests/test_collective_digest.py): what the collective check
compares, in the mode ``sys.argv[1]`` says; writes what each process saw to
``DIR/R.json`` (``sys.argv[2]``) and prints ``ok R``.

- ``buckets``: pytrees whose small leaves make the same buffer on both processes but
  differ in their leaves ((f64[2], f64[3]) against (f64[3], f64[2]); two f64[3] against
  one f64[6]), eagerly and under jit: every process raises CollectiveMismatchError (no
  misaligned sum), and stays in step.
- ``skip_inside``, ``skip_step``: a loop of 6 steps, one jitted psum each; process 1
  skips step 2 inside the data_parallel function (an early return) or before calling it
  (a ``continue``, the steps marked with ``distributed.step``): both processes raise at
  process 1's next collective, naming both step numbers.
- ``choices``: process 1 times the other convolution kernels faster (its ``_measure``
  made to say so) and records other values in a shared table of its own: after the next
  collective both processes hold process 0's choices (NOTE [one choice for every process]).
- ``settings``: process 1 alone sets ``DIGEST_RANK1_VARIABLE`` to ``DIGEST_RANK1_VALUE``
  (the check off, another timeout) before cuvmap reads it: ``initialize`` raises on both
  processes (without it, a psum would return process 1's own input).
"""
import json
import os
import sys

if sys.argv[1] == "settings" and os.environ.get("PMI_RANK") == "1":  # (before cuvmap reads its settings)
    os.environ[os.environ["DIGEST_RANK1_VARIABLE"]] = os.environ["DIGEST_RANK1_VALUE"]

import numpy as np  # noqa: E402

import cuvmap as cv  # noqa: E402
from cuvmap import distributed, lax  # noqa: E402

mode, out_dir = sys.argv[1], sys.argv[2]
seen = {}
if mode == "settings":
    R = int(os.environ["PMI_RANK"])
    try:
        group = distributed.initialize()
    except distributed.DistributedError as err:
        seen["error"] = str(err)
    else:
        seen["sum"] = distributed.data_parallel(lambda x: lax.psum(x, "batch"))(np.full(3, 1.0 + R)).tolist()
    with open(os.path.join(out_dir, f"{R}.json"), "w") as fh:
        json.dump(seen, fh)
    print(f"ok {R}", flush=True)
    sys.exit(0)
group = distributed.initialize()
R = group.rank


def caught(name, call):
    try:
        out = call()
    except distributed.CollectiveMismatchError as err:
        seen[name] = str(err)
    else:
        raise AssertionError(f"{name}: no error on process {R}, got {out}")


if mode == "buckets":
    trees = {"order": ((np.ones(2), np.ones(3)) if R == 0 else (np.ones(3), np.ones(2))),
             "split": ([np.ones(3), np.ones(3)] if R == 0 else [np.ones(6)])}
    after = distributed.data_parallel(lambda t: lax.psum(t, "batch"))
    for name, t in trees.items():
        for how, fn in (("eager", lambda t: lax.psum(t, "batch")), ("jit", cv.jit(lambda t: lax.psum(t, "batch")))):
            caught(f"{name} {how}", lambda: distributed.data_parallel(fn)(t))
            total = after((np.full(2, 1.0 + R), np.full(3, 2.0)))
            assert np.array_equal(total[0], [3.0, 3.0]) and np.array_equal(total[1], [4.0, 4.0, 4.0]), total
elif mode in ("skip_inside", "skip_step"):
    psum = cv.jit(lambda x: lax.psum(x, "batch"))

    def train(x, k):
        if R == 1 and mode == "skip_inside" and k == 2:
            return x  # (a branch on this process's own data)
        return psum(x)

    run = distributed.data_parallel(train)
    done = []
    try:
        for k in range(6):
            distributed.step(k)
            if R == 1 and mode == "skip_step" and k == 2:
                continue
            run(np.full(3, float(k)), k)
            done.append(k)
    except distributed.CollectiveMismatchError as err:
        seen["error"] = str(err)
    seen["done"] = done
elif mode == "choices":
    from cuvmap import measured_choices
    from cuvmap.lax import conv_strategy, convolution

    table = measured_choices.MeasuredChoices("digest_test")
    if R == 1:  # this process "times" the other kernels faster (load on its cores, say)
        measure = conv_strategy._measure

        def other_kernel(*args):
            (choice, times), out = measure(*args)
            flipped = [k for k in times if k != choice][0]
            return (flipped, times), out

        conv_strategy._measure = other_kernel
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    step = distributed.data_parallel(lambda x: lax.psum(lax.conv(x, w, padding=1), "batch"))
    for k in range(3):
        table.record(("layer", k), f"process {R}'s choice {k}")
        step(x)
    seen["table"] = sorted((repr(k), v) for k, v in table.snapshot().items())
    seen["conv"] = sorted((repr(k), v[0]) for k, v in convolution.measured_choices().items())
else:
    raise SystemExit(f"unknown mode {mode!r}")

with open(os.path.join(out_dir, f"{R}.json"), "w") as fh:
    json.dump(seen, fh)
print(f"ok {R}", flush=True)
