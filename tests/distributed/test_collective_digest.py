"""What the collective check compares (issue 34, items 1-3): the leaves of a bucket, the
step (data_parallel's calls and ``distributed.step``), and the settings the processes
agreed on at ``initialize``. Threads stand in for the processes (each a ``ProcessGroup``
over a shared exchange); the same cases under ``mpiexec -n 2`` run in
``tests/distributed_jobs/digest.py`` (marked slow)."""
import importlib.util
import json
import os
import pathlib
import re
import threading

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import config, distributed, lax

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "distributed_jobs"


class ThreadEngine:
    """The collectives a check needs (allreduce, allgather) over threads of one process,
    from their definitions; ``calls`` counts the exchanges."""

    class Exchange:
        def __init__(self, size):
            self.size = size
            self.slots = [None] * size
            self.barrier = threading.Barrier(size, timeout=30)
            self.calls = [0] * size

    def __init__(self, exchange, rank):
        self.exchange, self.rank, self.size = exchange, rank, exchange.size

    def _all(self, x):
        ex = self.exchange
        ex.calls[self.rank] += 1
        ex.slots[self.rank] = np.array(x)
        ex.barrier.wait()
        values = list(ex.slots)
        ex.barrier.wait()
        return values

    def allreduce(self, x, op="sum", in_place=False):
        return {"sum": np.sum, "max": np.max, "min": np.min}[op](np.stack(self._all(x)), axis=0).astype(x.dtype)

    def allgather(self, x):
        return np.stack(self._all(x))

    def reduce_scatter(self, x):
        return np.sum(np.stack(self._all(x)), axis=0)[self.rank]

    def alltoall(self, x):
        return np.stack([v[self.rank] for v in self._all(x)])

    def permute(self, x, perm):
        values = self._all(x)
        source = [s for s, t in perm if t == self.rank]
        return values[source[0]].copy() if source else np.zeros_like(x)

    def barrier(self):
        self._all(np.zeros(()))

    def abort(self, code=1):
        self.exchange.barrier.abort()


def run_group(programs, timeout=60, group_kwargs=None):
    """``programs[r](group)`` in thread ``r``, each over its own ProcessGroup of one exchange
    (made with ``group_kwargs[r]``): ``(results, errors, exchange)`` by rank."""
    size = len(programs)
    exchange = ThreadEngine.Exchange(size)
    results, errors = [None] * size, [None] * size

    def run(rank):
        try:
            kwargs = (group_kwargs or {}).get(rank, {})
            group = distributed.ProcessGroup(engines={"cpu": ThreadEngine(exchange, rank)},
                                             **{"timeout": 120, **kwargs})
            results[rank] = programs[rank](group)
        except Exception as err:  # noqa: BLE001 - returned to the test
            errors[rank] = err

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread of the group hangs"
    return results, errors, exchange


def dp(f, *args):
    return lambda group: distributed.data_parallel(f, group=group)(*args)


def both_raise(errors, *patterns):
    for rank, err in enumerate(errors):
        assert isinstance(err, distributed.CollectiveMismatchError), errors
        for pattern in patterns:
            assert re.search(pattern, str(err)), str(err)
        assert f"This is process {rank}" in str(err)


# ---------------------------------------------------------------------------------------
# 1. the leaves of a bucket
# ---------------------------------------------------------------------------------------

# (rank 0's pytree, rank 1's, what the message says of each): each pair makes the same buffer
BUCKETS = {
    "(f64[2], f64[3]) vs (f64[3], f64[2])": (
        (np.ones(2), np.ones(3)), (np.ones(3), np.ones(2)),
        r"process 0 called psum over 'batch' of float64\[5\] \(a bucket of 2 leaves: float64\[2\], float64\[3\]\), "
        r"process 1 called psum over 'batch' of float64\[5\] \(a bucket of 2 leaves: float64\[3\], float64\[2\]\)"),
    "two f64[3] vs one f64[6]": (
        [np.ones(3), np.ones(3)], [np.ones(6)],
        r"process 0 called psum over 'batch' of float64\[6\] \(a bucket of 2 leaves: float64\[3\], float64\[3\]\), "
        r"process 1 called psum over 'batch' of float64\[6\];"),
    "f64[2, 3] vs f64[3, 2] in buckets": (
        {"a": np.ones((2, 3)), "b": np.ones(1)}, {"a": np.ones((3, 2)), "b": np.ones(1)},
        r"a bucket of 2 leaves: float64\[2, 3\], float64\[1\]\), .*a bucket of 2 leaves: float64\[3, 2\], "
        r"float64\[1\]\)"),
}


@pytest.mark.parametrize("op", ["psum", "pmean", "pmax", "pmin"])
@pytest.mark.parametrize("how", ["eager", "jit"])
@pytest.mark.parametrize("case", BUCKETS)
def test_buckets_that_differ_in_their_leaves_all_raise(case, how, op):
    """Leaves that concatenate into the same buffer on both processes, in another order or
    split otherwise: every process raises, naming each one's leaves (no misaligned sum)."""
    first, second, says = BUCKETS[case]
    fn = getattr(lax, op)
    if op != "psum":
        says = says.replace("psum", op if op != "pmean" else "psum")

    def program(tree_):
        f = (lambda t: fn(t, "batch"))
        f = cv.jit(f) if how == "jit" else f

        def run(group):
            with pytest.raises(distributed.CollectiveMismatchError) as info:
                dp(f, tree_)(group)
            # still in step: a matching bucket works, and sums
            after = dp(lambda t: lax.psum(t, "batch"), [np.full(2, 1.0), np.full(3, 2.0)])(group)
            return str(info.value), after

        return run

    results, errors, _ = run_group([program(first), program(second)])
    assert errors == [None, None], errors
    for rank, (message, after) in enumerate(results):
        assert re.search(says, message), message
        assert f"This is process {rank}" in message
        np.testing.assert_array_equal(after[0], [2.0, 2.0])
        np.testing.assert_array_equal(after[1], [4.0, 4.0, 4.0])


def test_matching_buckets_cost_one_check_and_differentiate():
    """The same leaves on both processes: one checked all-reduce per bucket, the sums of
    each leaf, and grad through the bucket (its transpose a bucketed psum too)."""
    def loss(w):
        s = lax.psum({"a": w["a"] * w["a"], "b": 3.0 * w["b"]}, "batch")
        return cv.numpy.sum(s["a"]) + cv.numpy.sum(s["b"])

    def program(group):
        r = group.rank
        w = {"a": np.arange(2.0) + r, "b": np.arange(3.0) - r}
        before = group.check.count
        out = dp(lambda w: lax.psum(w, "batch"), w)(group)
        checks = group.check.count - before
        g = dp(cv.jit(cv.grad(loss)), w)(group)
        return out, checks, g, w

    results, errors, _ = run_group([program, program])
    assert errors == [None, None], errors
    for out, checks, g, w in results:
        assert checks == 1
        np.testing.assert_array_equal(out["a"], 2 * np.arange(2.0) + 1)
        np.testing.assert_array_equal(out["b"], 2 * np.arange(3.0) - 1)
        # d/dw of Σ_processes (a² + 3b) summed over the processes' outputs: 2 · (2a, 3)
        np.testing.assert_allclose(g["a"], 2 * 2 * w["a"])
        np.testing.assert_allclose(g["b"], 2 * np.full(3, 3.0))


def test_a_bucket_carries_its_leaves_in_the_program_and_a_single_leaf_does_not():
    group = distributed.ProcessGroup(engines={"cpu": ThreadEngine(ThreadEngine.Exchange(1), 0)})
    group.size = 2   # (only traced: no collective runs)
    text = str(cv.make_jaxpr(distributed.data_parallel(lambda t: lax.psum(t, "batch"), group=group))(
        (np.ones(2), np.ones((1, 3)))))
    assert "leaves=((2,), (1, 3))" in text, text
    text = str(cv.make_jaxpr(distributed.data_parallel(lambda t: lax.psum(t, "batch"), group=group))(np.ones(2)))
    assert "leaves" not in text, text


# ---------------------------------------------------------------------------------------
# 2. the step: data_parallel's calls and distributed.step
# ---------------------------------------------------------------------------------------

STEPS = 6


def _loop(skip_inside=None, skip_step=None, mark=True):
    """A training loop of STEPS steps, each one psum in a data_parallel function; this
    process skips step ``skip_inside`` inside the function (an early return) or step
    ``skip_step`` before calling it (a continue). Returns ``(steps done, error)``."""
    def program(group):
        def train(x, k):
            if k == skip_inside:
                return x  # (a branch on this process's own data)
            return lax.psum(x, "batch")

        run = distributed.data_parallel(train, group=group)
        done = []
        try:
            for k in range(STEPS):
                if mark:
                    distributed.step(k, group=group)
                if k == skip_step:
                    continue
                run(np.full(3, float(k)), k)
                done.append(k)
        except distributed.CollectiveMismatchError as err:
            return done, err
        return done, None

    return program


@pytest.mark.parametrize("how", ["inside", "before the call"])
def test_a_skipped_step_is_named_at_the_next_collective(how):
    """Process 1 skips step 2's psum: inside the function (its next call is one ahead) or
    with a continue before calling it (it marked step 3): both processes raise at process
    1's next collective, naming both step numbers, not at the end of the job."""
    # (inside, the count of data_parallel calls finds it without any marker)
    mark = how != "inside"
    skipper = _loop(skip_inside=2, mark=mark) if how == "inside" else _loop(skip_step=2)
    results, errors, _ = run_group([_loop(mark=mark), skipper])
    assert errors == [None, None], errors
    (done0, err0), (done1, err1) = results
    assert done0 == [0, 1] and done1 == [0, 1, 2][:2 + (how == "inside")], (done0, done1)
    if how == "inside":
        says = (r"disagree about collective #2: process 0 called psum over 'batch' of float64\[3\] in data_parallel "
                r"call #3, process 1 called psum over 'batch' of float64\[3\] in data_parallel call #4")
    else:
        says = (r"disagree about collective #2: process 0 called psum over 'batch' of float64\[3\] at step 2, "
                r"process 1 called psum over 'batch' of float64\[3\] at step 3")
    both_raise([err0, err1], says, "skipped or added a step's collectives")


def test_without_the_marker_a_step_skipped_before_the_call_shows_at_the_end():
    """(What distributed.step adds: without it, the calls pair off by one until the end.)"""
    def ends(program):
        def run(group):
            done, err = program(group)
            if err is not None:
                raise err
            group.end()
            return done
        return run

    results, errors, _ = run_group([ends(_loop(mark=False)), ends(_loop(skip_step=2, mark=False))])
    both_raise(errors, r"disagree about collective #5: process 0 called psum over 'batch' of float64\[3\], process 1 "
                       r"reached the end of its program after 5 collectives")


def test_steps_that_agree_cost_nothing_more():
    """Marked steps, nested data_parallel calls (counted once) and a backward pass that runs
    after data_parallel returned: no error, the same number of exchanges as before (one
    check per collective)."""
    def program(group):
        inner = distributed.data_parallel(lambda x: lax.psum(x, "batch"), group=group)
        outer = distributed.data_parallel(lambda x: inner(x) * 2, group=group)
        loss = distributed.data_parallel(lambda w: cv.numpy.sum(lax.psum(w * w, "batch")), group=group)
        outs = []
        for k in range(3):
            distributed.step(k, group=group)
            outs.append(outer(np.full(2, 1.0 + group.rank)))
            outs.append(cv.grad(loss)(np.full(2, 1.0)))
        return outs, group.check.calls

    results, errors, exchange = run_group([program, program])
    assert errors == [None, None], errors
    # per step: the psum of outer (nested: one call), the psums of grad(loss) forward and
    # backward; each checked once (a check and a psum: two exchanges); and the settings
    # agreed when the group was made
    assert exchange.calls == [1 + 18, 1 + 18]
    for outs, calls in results:
        assert calls == 6
        np.testing.assert_array_equal(outs[0], [6.0, 6.0])
        np.testing.assert_array_equal(outs[1], [4.0, 4.0])  # d/dw Σ_processes Σ_members w²: 2 · 2w


def test_the_step_number_is_checked():
    group = distributed.ProcessGroup()
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="distributed.step: the step number must be an int >= 0"):
            distributed.step(bad, group=group)
    distributed.step(np.int64(3), group=group)  # (a job of one: nothing to compare)


# ---------------------------------------------------------------------------------------
# 3. the settings every process shares
# ---------------------------------------------------------------------------------------


def test_processes_with_other_timeouts_are_refused_when_the_group_is_made():
    """(The check's setting is process-wide, one for all threads here: its disagreement is
    tested under mpiexec below.)"""
    results, errors, exchange = run_group([lambda g: g, lambda g: g], group_kwargs={0: {"timeout": 120},
                                                                                   1: {"timeout": 60}})
    for rank, err in enumerate(errors):
        assert isinstance(err, distributed.DistributedError), errors
        assert (f"process {rank} of 2: the processes of the job disagree about the collective check or the "
                "collective timeout: process 0 has the check on and a timeout of 120 s, process 1 has the check on "
                "and a timeout of 60 s. Set CUVMAP_COLLECTIVE_CHECK and CUVMAP_COLLECTIVE_TIMEOUT") in str(err)
    assert exchange.calls == [2, 2]  # the agreement and the gathering of the values


def test_processes_that_agree_make_their_group_with_one_exchange():
    for enabled in (True, False):
        with config.override(collective_check=enabled):
            results, errors, exchange = run_group([lambda g: g.timeout, lambda g: g.timeout])
        assert errors == [None, None] and results == [120.0, 120.0] and exchange.calls == [1, 1]


# ---------------------------------------------------------------------------------------
# Under mpiexec -n 2
# ---------------------------------------------------------------------------------------

MPIEXEC = distributed.find_mpiexec()
needs_mpiexec = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="no mpiexec or mpi4py: pip install mpi4py mpich (the test extra does on Linux x86-64)")


def run_job(mode, tmp_path, timeout=180, **env):
    """``tests/distributed_jobs/digest.py MODE`` on 2 processes: ``(result, {rank: seen})``."""
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL"))}
    job_env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    job_env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **env)
    result = distributed.launch(2, [str(JOBS / "digest.py"), mode, str(tmp_path)], env=job_env, timeout=timeout,
                                capture_output=True, text=True, cwd=str(ROOT))
    seen = {r: json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1) if (tmp_path / f"{r}.json").exists()}
    return result, seen


@pytest.mark.slow
@needs_mpiexec
def test_buckets_that_differ_in_their_leaves_on_two_processes(tmp_path):
    result, seen = run_job("buckets", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    wants = {"order": r"a bucket of 2 leaves: float64\[2\], float64\[3\]\), process 1 called psum over 'batch' of "
                      r"float64\[5\] \(a bucket of 2 leaves: float64\[3\], float64\[2\]\)",
             "split": r"a bucket of 2 leaves: float64\[3\], float64\[3\]\), process 1 called psum over 'batch' of "
                      r"float64\[6\];"}
    for rank in (0, 1):
        assert sorted(seen[rank]) == sorted(f"{n} {h}" for n in wants for h in ("eager", "jit"))
        for case, message in seen[rank].items():
            assert re.search(wants[case.split()[0]], message), (rank, case, message)
            assert f"This is process {rank}" in message


@pytest.mark.slow
@needs_mpiexec
@pytest.mark.parametrize("mode", ["skip_inside", "skip_step"])
def test_a_skipped_step_on_two_processes(tmp_path, mode):
    """Process 1 skips step 2 (inside the function, or before the call with the steps
    marked): both processes raise at its next collective, on step 3 of process 1, not at
    the end of the job; the job then ends normally (status 0)."""
    result, seen = run_job(mode, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    if mode == "skip_inside":  # (process 1 is one step and one data_parallel call ahead)
        says = ("disagree about collective #2: process 0 called psum over 'batch' of float64[3] at step 2 in "
                "data_parallel call #3, process 1 called psum over 'batch' of float64[3] at step 3 in data_parallel "
                "call #4")
    else:
        says = ("disagree about collective #2: process 0 called psum over 'batch' of float64[3] at step 2, "
                "process 1 called psum over 'batch' of float64[3] at step 3")
    assert seen[0]["done"] == [0, 1] and seen[1]["done"] == ([0, 1, 2] if mode == "skip_inside" else [0, 1])
    for rank in (0, 1):
        assert says in seen[rank]["error"], seen[rank]["error"]
        assert f"This is process {rank}" in seen[rank]["error"]


@pytest.mark.slow
@needs_mpiexec
@pytest.mark.parametrize("variable, value, says", [
    ("CUVMAP_COLLECTIVE_CHECK", "0", "process 0 has the check on and a timeout of 20 s, process 1 has the check off "
                                     "and a timeout of 20 s"),
    ("CUVMAP_COLLECTIVE_TIMEOUT", "30", "process 0 has the check on and a timeout of 20 s, process 1 has the check "
                                        "on and a timeout of 30 s"),
])
def test_processes_with_other_settings_are_refused_at_initialize(tmp_path, variable, value, says):
    """Process 1 alone turns the check off (or has another timeout): initialize raises on
    both processes, naming each one's values, instead of returning process 1's own input as
    the sum while process 0 waits out the timeout."""
    result, seen = run_job("settings", tmp_path, timeout=120, CUVMAP_COLLECTIVE_TIMEOUT="20",
                           DIGEST_RANK1_VARIABLE=variable, DIGEST_RANK1_VALUE=value)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert "sum" not in seen[rank], seen[rank]
        assert f"process {rank} of 2: the processes of the job disagree" in seen[rank]["error"]
        assert says in seen[rank]["error"], seen[rank]["error"]



# ---------------------------------------------------------------------------------------
# The processes of a job agree on measured choices (issue 34, item 13)
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_mpiexec
def test_the_processes_of_a_job_take_process_0s_measured_choices(tmp_path):
    """Process 1 times the other convolution kernels faster: from the next collective on
    both processes run process 0's (before: each its own, and a run on 2 processes differed
    from itself by the kernels' rounding); a named table of process 1 holds process 0's
    values too."""
    result, seen = run_job("choices", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert seen[0]["conv"] and seen[0]["conv"] == seen[1]["conv"], seen
    assert seen[1]["table"] == [[repr(("layer", k)), f"process 0's choice {k}"] for k in range(3)], seen[1]


# ---------------------------------------------------------------------------------------
# 4. what the check cannot see, stated (docs/caveats-distributed-dp.md) and shown
# ---------------------------------------------------------------------------------------

CAVEATS = ROOT / "docs" / "caveats.md"


def test_a_psum_in_a_branch_one_process_takes_gives_one_wrong_value_then_stops():
    """As the caveats page says: process 0 alone takes the branch with a psum at step 1;
    its psum pairs with process 1's next one (alike: same step, shape and dtype), so
    process 1 gets one wrong value; the next collective then raises on both."""
    text = " ".join(CAVEATS.read_text().split())
    assert "A `psum` inside a `cond` branch that only some processes take" in text
    assert "one wrong value for that step, then the job stops" in text

    def program(group):
        def step(x, flag):
            y = lax.cond(flag, lambda v: lax.psum(v, "batch"), lambda v: v, x)
            return lax.psum(y * 10, "batch")

        f = distributed.data_parallel(cv.jit(step), group=group)
        outs = []
        try:
            for k in range(3):
                outs.append(f(np.full(3, 1.0 + group.rank), np.bool_(group.rank == 0 and k == 1)).tolist())
        except distributed.CollectiveMismatchError as err:
            return outs, str(err)
        return outs, None

    results, errors, _ = run_group([program, program])
    assert errors == [None, None], errors
    (outs0, err0), (outs1, err1) = results
    assert outs0 == [[30.0] * 3] and outs1 == [[30.0] * 3, [21.0] * 3]   # (the right value was 60)
    for err in (err0, err1):
        assert "in data_parallel call #2, process 1 called psum over 'batch' of float64[3] in data_parallel call #3" \
            in err, err


def test_pmean_over_uneven_batches_weights_processes_and_the_recipe_weights_examples():
    text = " ".join(CAVEATS.read_text().split())
    assert "`pmean` over processes with uneven batches weights processes, not examples" in text
    assert 'total = lax.psum(cnp.sum(per_example_loss * mask), "batch")' in text
    losses = np.array([[4.0, 0, 0, 0], [1.0, 2.0, 3.0, 0]])      # process 0: 1 example; process 1: 3
    masks = np.array([[1.0, 0, 0, 0], [1.0, 1.0, 1.0, 0]])
    cnp = cv.numpy

    def means(per_example_loss, mask):
        pmean = lax.pmean(cnp.sum(per_example_loss * mask) / cnp.sum(mask), "batch")
        total = lax.psum(cnp.sum(per_example_loss * mask), "batch")
        count = lax.psum(cnp.sum(mask), "batch")
        return pmean, total / cnp.maximum(count, 1)

    pmean, recipe = cv.vmap(means, axis_name="batch")(losses, masks)
    assert float(pmean[0]) == (4.0 + 2.0) / 2                       # the mean of the processes' means
    assert float(recipe[0]) == (4.0 + 1.0 + 2.0 + 3.0) / 4          # the mean over the examples
