"""The collective check, the engine registry and the exit hooks in one process: threads
stand in for the processes of a group (each thread a ``ProcessGroup`` over a thread
engine), so that every disagreement of issue 24 (another primitive, shape, dtype or
size, a skipped collective, a process that ends) is checked on every CI run; the same
cases under ``mpiexec -n 2`` are in ``tests/distributed/test_distributed.py``. Collectives over
non-array leaves raise TypeError (JAX: "not a valid JAX type")."""
import os
import pathlib
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import config, distributed, lax
from cuvmap.distributed import check as check_mod
from cuvmap.distributed import engine as engine_mod
from cuvmap.distributed import watchdog as watchdog_mod

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/<area>/this file


class ThreadEngine:
    """An :class:`~cuvmap.distributed.engine.Engine` over threads: ``size`` threads of one
    process exchange values through shared slots; each collective written from its
    definition. ``calls`` counts the exchanges (a check is one)."""

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


def run_group(programs, timeout=60):
    """Runs ``programs[r](group)`` in thread ``r``, each with a ProcessGroup of its own
    over one exchange; returns ``(results, errors, exchange)`` indexed by rank."""
    size = len(programs)
    exchange = ThreadEngine.Exchange(size)
    results, errors = [None] * size, [None] * size

    def run(rank):
        group = distributed.ProcessGroup(engines={"cpu": ThreadEngine(exchange, rank)}, timeout=120)
        try:
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


def dp(f):
    return lambda group: distributed.data_parallel(f, group=group)()


# (what rank 0 calls, what rank 1 calls, what the error says besides the ranks)
MISMATCHES = [
    ("psum vs pmax",
     lambda: lax.psum(np.array([1.0, 5, -2]), "batch"), lambda: lax.pmax(np.array([3.0, 1, 4]), "batch"),
     r"collective #0: process 0 called psum over 'batch' of float64\[3\], process 1 called pmax over 'batch' of "
     r"float64\[3\]"),
    ("shapes (2, 3) vs (3, 2)",
     lambda: lax.psum(np.ones((2, 3)), "batch"), lambda: lax.psum(np.ones((3, 2)), "batch"),
     r"process 0 called psum over 'batch' of float64\[2, 3\], process 1 called psum over 'batch' of float64\[3, 2\]"),
    ("float64[4] vs float32[8]",
     lambda: lax.psum(np.ones(4), "batch"), lambda: lax.psum(np.ones(8, np.float32), "batch"),
     r"float64\[4\], process 1 called psum over 'batch' of float32\[8\]"),
    ("float64[4] vs int64[4]",
     lambda: lax.psum(np.ones(4), "batch"), lambda: lax.psum(np.ones(4, np.int64), "batch"),
     r"float64\[4\], process 1 called psum over 'batch' of int64\[4\]"),
    ("(3,) vs (4,)",
     lambda: lax.psum(np.ones(3), "batch"), lambda: lax.psum(np.ones(4), "batch"),
     r"float64\[3\], process 1 called psum over 'batch' of float64\[4\]"),
    ("all_gather vs psum",
     lambda: lax.all_gather(np.ones(3), "batch"), lambda: lax.psum(np.ones(3), "batch"),
     r"process 0 called all_gather over 'batch' of float64\[3\], process 1 called psum"),
    ("two permutations",
     lambda: lax.ppermute(np.ones(3), "batch", [(0, 1)]), lambda: lax.ppermute(np.ones(3), "batch", [(1, 0)]),
     r"ppermute over 'batch' of float64\[3\] with perm=\[\(0, 1\)\], process 1 called ppermute over 'batch' of "
     r"float64\[3\] with perm=\[\(1, 0\)\]"),
]


@pytest.mark.parametrize("name, first, second, says", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_processes_that_disagree_all_raise(name, first, second, says):
    """Every process raises CollectiveMismatchError naming both collectives, before any
    data moves; afterwards the processes are still in step (a matching psum works)."""
    after = lambda: lax.psum(np.full(2, 1.0), "batch")  # noqa: E731

    def program(f):
        def run(group):
            with pytest.raises(distributed.CollectiveMismatchError) as info:
                dp(f)(group)
            return str(info.value), dp(after)(group)

        return run

    results, errors, exchange = run_group([program(first), program(second)])
    assert errors == [None, None], errors
    for rank, (message, total) in enumerate(results):
        assert re.search(says, message), message
        assert "the 2 processes of the group disagree" in message and f"This is process {rank}" in message
        assert message.startswith("data_parallel(<lambda>, axis_name='batch'): ")
        np.testing.assert_array_equal(total, [2.0, 2.0])
    # per process: the group's agreement on its settings when it was made, the failed check,
    # its gathering of the descriptions (2), the next check and its psum; nothing else went out
    assert exchange.calls == [6, 6]


def test_agreeing_processes_pay_one_exchange_per_collective():
    """With the check on, each collective costs one extra exchange (the check), under jit
    as eagerly; with it off, none; the results are the same."""
    def step(x):
        return lax.psum({"a": x, "b": 2 * x}, "batch"), lax.all_gather(x, "batch")

    for enabled, per_call in ((True, 4), (False, 2)):  # a bucketed psum and an all_gather, checked or not
        with config.override(collective_check=enabled):
            def program(group):
                x = np.arange(3.0) + group.rank
                return [distributed.data_parallel(fn, group=group)(x) for fn in (step, cv.jit(step))]

            results, errors, exchange = run_group([program, program])
        assert errors == [None, None], errors
        assert exchange.calls == [1 + 2 * per_call] * 2, (enabled, exchange.calls)  # (1: the settings agreed)
        for rank, outs in enumerate(results):
            for (sums, gathered) in outs:
                np.testing.assert_array_equal(sums["a"], 2 * np.arange(3.0) + 1)
                np.testing.assert_array_equal(sums["b"], 2 * (2 * np.arange(3.0) + 1))
                np.testing.assert_array_equal(gathered, [np.arange(3.0), np.arange(3.0) + 1])


def test_a_process_that_ends_while_another_waits():
    """The end of a program is the check's last exchange: a process that ends while the
    other calls a collective raises (at exit, the hook reports it and aborts); the other
    raises in its collective, naming the process that ended."""
    def waits(group):
        dp(lambda: lax.psum(np.ones(3), "batch"))(group)
        dp(lambda: lax.psum(np.ones(3), "batch"))(group)

    def ends(group):
        dp(lambda: lax.psum(np.ones(3), "batch"))(group)
        group.end()

    results, errors, _ = run_group([waits, ends])
    for err in errors:
        assert isinstance(err, distributed.CollectiveMismatchError), errors
        assert re.search(r"disagree about collective #1: process 0 called psum over 'batch' of float64\[3\], "
                         r"process 1 reached the end of its program after 1 collective;", str(err)), str(err)
        assert "skipped or added a collective" in str(err)
    # every process ends: nothing to report
    results, errors, _ = run_group([ends, ends])
    assert errors == [None, None]


def test_a_skipped_collective_shows_in_the_sequence_numbers():
    """A process that counted a collective the others did not (here: one made with the
    check off on that process only) is found by the sequence number."""
    def counted(group):
        group.check.note("psum", "batch", np.dtype(np.float64), (3,))
        dp(lambda: lax.psum(np.ones(3), "batch"))(group)

    def plain(group):
        dp(lambda: lax.psum(np.ones(3), "batch"))(group)

    _, errors, _ = run_group([counted, plain])
    for err in errors:
        assert isinstance(err, distributed.CollectiveMismatchError), errors
        assert re.search(r"their next collective: process 0 called psum over 'batch' of float64\[3\] as collective "
                         r"#1, process 1 called psum over 'batch' of float64\[3\] as collective #0", str(err)), str(err)


def test_three_processes_name_who_disagrees():
    run = lambda f: lambda group: dp(f)(group)  # noqa: E731
    same = lambda: lax.psum(np.ones(2), "batch")  # noqa: E731
    _, errors, _ = run_group([run(same), run(lambda: lax.pmin(np.ones(2), "batch")), run(same)])
    for err in errors:
        assert re.search(r"processes 0, 2 called psum over 'batch' of float64\[2\], process 1 called pmin", str(err))


@pytest.mark.slow
def test_the_check_digest_is_the_same_in_every_process():
    """The digest must not use Python's hash of strings (randomised per process)."""
    key = ("psum", "batch", np.dtype(np.float32), (np.int64(3), 4), None)
    assert check_mod._digest(key) == check_mod._digest(("psum", "batch", np.dtype("float32"), (3, 4), None))
    assert 0 <= check_mod._digest(key) < 2 ** 62
    code = ("import numpy as np; from cuvmap.distributed import check; "
            "print(check._digest(('psum', 'batch', np.dtype('float32'), (3, 4), None)))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    seen = {subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONHASHSEED=seed), capture_output=True,
                           text=True, check=True, timeout=120).stdout.strip() for seed in ("1", "2")}
    assert seen == {str(check_mod._digest(key))}


@pytest.mark.parametrize("text, want", [("0", False), ("off", False), ("1", True), ("true", True)])
def test_the_check_setting(text, want, monkeypatch):
    assert config.read("collective_check") is True  # on by default
    assert config._bool(text, "CUVMAP_COLLECTIVE_CHECK") is want
    with config.override(collective_check=not want):
        config.update("collective_check", text)
        assert config.read("collective_check") is want
        assert check_mod.enabled() is want


@pytest.mark.parametrize("status, code", [(None, 0), (0, 0), (3, 3), (256 + 7, 7), (-1, 255), ("bye", 1), (True, 1)])
def test_the_exit_status_of_sys_exit(status, code):
    assert watchdog_mod.exit_status(status) == code


def test_the_exit_hook_remembers_sys_exit(monkeypatch):
    """``sys.exit`` keeps raising SystemExit (its status as given), and the hook notes the
    main thread's status; a thread's sys.exit is not the process's."""
    registered = []
    monkeypatch.setattr(sys, "exit", sys.exit)
    monkeypatch.setattr(watchdog_mod.atexit, "register", registered.append)
    ends, aborts = [], []
    state = watchdog_mod.install_exit_hooks("process 1 of 2", aborts.append, lambda: ends.append(1))
    with pytest.raises(SystemExit) as info:
        sys.exit(3)
    assert info.value.code == 3 and state.status == 3
    def thread_exits():
        try:
            sys.exit(5)
        except SystemExit:
            pass

    thread = threading.Thread(target=thread_exits)
    thread.start()
    thread.join()
    assert state.status == 3
    (at_exit,) = registered
    at_exit()
    assert aborts == [3] and ends == []
    state.status = None
    at_exit()
    assert aborts == [3] and ends == [1]  # a normal end: the check's last exchange, no abort

    def disagree():
        raise distributed.CollectiveMismatchError("process 0 called psum ...")

    state = watchdog_mod.install_exit_hooks("process 1 of 2", aborts.append, disagree)
    registered[-1]()
    assert aborts == [3, 1]


# ---------------------------------------------------------------------------------------
# The engine interface
# ---------------------------------------------------------------------------------------


def test_engines_satisfy_the_protocol():
    from cuvmap.distributed.mpi import MPIEngine
    from cuvmap.distributed.nccl import NCCLEngine

    assert isinstance(engine_mod.LocalEngine(), distributed.Engine)
    assert isinstance(ThreadEngine(ThreadEngine.Exchange(1), 0), distributed.Engine)
    for cls in (MPIEngine, NCCLEngine):
        for name in ("allreduce", "allgather", "reduce_scatter", "alltoall", "permute", "barrier", "abort"):
            assert callable(getattr(cls, name)), (cls, name)
    assert isinstance(engine_mod.LocalBootstrap(), distributed.Bootstrap)


def test_engines_are_chosen_by_the_operands_array_kind():
    made = []

    class Recording(engine_mod.LocalEngine):
        def allreduce(self, x, op="sum", in_place=False):
            made.append(op)
            return x * 1

    previous = distributed.register_engine("cpu", lambda group: Recording())
    try:
        group = distributed.ProcessGroup()
        out = distributed.data_parallel(lambda x: lax.pmax(x, "batch"), group=group)(np.ones(2))
        np.testing.assert_array_equal(out, [1, 1])
        assert made == ["max"] and "cpu: Recording" in repr(group)
    finally:
        distributed.register_engine("cpu", previous)
    assert engine_mod.array_kind(np.ones(1)) == "cpu"
    with pytest.raises(ValueError, match="kind must be 'cpu'"):
        distributed.register_engine("tpu", lambda group: None)


def test_nccl_on_several_processes_needs_a_bootstrap(monkeypatch):
    from cuvmap.distributed import nccl as nccl_mod

    fake = type(sys)("cupy")
    fake.cuda = type(sys)("cupy.cuda")
    fake.cuda.nccl = type(sys)("cupy.cuda.nccl")
    fake.cuda.nccl.get_unique_id = lambda: b"id"
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", fake.cuda.nccl)
    with pytest.raises(distributed.DistributedError, match="needs a bootstrap"):
        nccl_mod.NCCLEngine(0, 2)


# ---------------------------------------------------------------------------------------
# Non-array leaves
# ---------------------------------------------------------------------------------------


LEAVES = [
    ("psum", lambda: lax.psum({"a": np.ones(3), "b": "s"}, "i"),
     r"psum: Argument 's' of type <class 'str'> \(at x\['b'\]\)"),
    ("all_gather", lambda: lax.all_gather("s", "i"), r"all_gather: Argument 's' of type <class 'str'> is not"),
    ("pmax", lambda: lax.pmax(object(), "i"), r"pmax: Argument <object object.*> of type <class 'object'> is not"),
    ("ppermute", lambda: lax.ppermute("s", "i", [(0, 0)]), r"ppermute: Argument 's' of type <class 'str'> is not"),
    ("pmean", lambda: lax.pmean([np.ones(2), None, b"b"], "i"),
     r"pmean: Argument b'b' of type <class 'bytes'> \(at x\[2\]\)"),
    ("psum_scatter", lambda: lax.psum_scatter(np.array(["a", "b"]), "i"), r"of dtype <U1 is not a valid"),
    ("all_to_all", lambda: lax.all_to_all(np.array([None, None]), "i", 0, 0), r"of dtype object is not a valid"),
]


@pytest.mark.parametrize("name, call, says", LEAVES, ids=[c[0] for c in LEAVES])
def test_a_collective_of_a_non_array_leaf_is_a_type_error(name, call, says):
    with pytest.raises(TypeError, match=says) as info:
        cv.vmap(lambda x: call(), axis_name="i")(np.ones(2))
    assert "is not a valid cuvmap type" in str(info.value)
    group = distributed.ProcessGroup()
    with pytest.raises(TypeError, match=says):
        distributed.data_parallel(lambda: call(), axis_name="i", group=group)()


def test_collectives_still_take_scalars_and_none():
    out = cv.vmap(lambda x: lax.psum({"x": x, "one": 1.0, "flag": np.bool_(True), "none": None}, "i"),
                  axis_name="i")(np.ones(3))
    for key in ("x", "one", "flag"):  # (the unmapped sums, one per example)
        np.testing.assert_array_equal(out[key], [3, 3, 3])
    assert out["none"] is None and out["flag"].dtype == np.int64


# ---------------------------------------------------------------------------------------
# Buckets: the small leaves of a pytree reduced across processes share one collective
# ---------------------------------------------------------------------------------------


def _tree_of(rank):
    r = np.random.default_rng(rank)
    return {"w": r.standard_normal((3, 4)).astype(np.float32), "b": r.standard_normal(4).astype(np.float32),
            "v": r.standard_normal(5), "u": r.standard_normal((2, 2)), "e": np.zeros((0, 3)),
            "big": r.standard_normal(300_000).astype(np.float32),  # 1.2 MB: alone
            "flag": r.standard_normal(3) > 0, "i": r.integers(0, 9, 2), "s": 2.0 + rank}


@pytest.mark.parametrize("op", ["psum", "pmean", "pmax", "pmin"])
def test_small_leaves_share_one_collective(op):
    """Each leaf gets what its own collective gives (a per-leaf NumPy reduction over the
    processes' values), with one collective per bucket: float32 {w, b}, float64 {v, u, e},
    and the big, boolean, integer and Python-scalar leaves alone (6 instead of 9)."""
    fn = getattr(lax, op)
    trees = [_tree_of(r) for r in range(2)]

    def program(group):
        mine = trees[group.rank]
        before = group.check.count
        eager = distributed.data_parallel(lambda t: fn(t, "batch"), group=group)(mine)
        middle = group.check.count
        staged = distributed.data_parallel(cv.jit(lambda t: fn(t, "batch")), group=group)(mine)
        return eager, staged, middle - before, group.check.count - middle

    results, errors, _ = run_group([program, program])
    assert errors == [None, None], errors
    reduce = {"psum": np.sum, "pmean": np.mean, "pmax": np.max, "pmin": np.min}[op]
    for eager, staged, n_eager, n_staged in results:
        assert (n_eager, n_staged) == (6, 6)
        for out in (eager, staged):
            for key in trees[0]:
                values = np.stack([np.asarray(t[key]) for t in trees])
                if op in ("psum", "pmean") and values.dtype == np.bool_:
                    values = values.astype(np.int64)
                want = reduce(values, axis=0)
                got = np.asarray(out[key])
                assert got.shape == want.shape, key
                if op != "pmean":
                    assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{op} {key}")


def test_buckets_are_bounded(monkeypatch):
    """Leaves up to _BUCKET_LEAF_BYTES join buckets of at most _BUCKET_BYTES (made tiny
    here): three 64-byte leaves make a bucket of two and one alone; a 72-byte leaf is alone."""
    from cuvmap.lax import parallel

    monkeypatch.setattr(parallel, "_BUCKET_LEAF_BYTES", 64)
    monkeypatch.setattr(parallel, "_BUCKET_BYTES", 128)
    trees = [[np.full(8, 1.0 + r), np.full(8, 2.0 + r), np.full(8, 3.0 + r), np.full(9, 4.0 + r)] for r in range(2)]

    def program(group):
        before = group.check.count
        out = distributed.data_parallel(lambda t: lax.psum(t, "batch"), group=group)(trees[group.rank])
        return out, group.check.count - before

    results, errors, _ = run_group([program, program])
    assert errors == [None, None], errors
    for out, count in results:
        assert count == 3
        for k, leaf in enumerate(out):
            np.testing.assert_array_equal(leaf, trees[0][k] + trees[1][k])


def test_the_gradient_through_a_bucketed_psum():
    """grad of a loss of psum'd parameters (a pytree, bucketed) under jit on two "processes"
    equals the same function under vmap(axis_name=...) (which never buckets)."""
    trees = [{"a": np.arange(3.0) + r, "b": np.ones((2, 2)) * (r + 1), "c": np.float64(0.5 * r)} for r in range(2)]

    def loss(t):
        s = lax.psum(t, "batch")
        return cv.numpy.sum(s["a"] * t["a"]) + cv.numpy.sum(cv.numpy.sin(s["b"]) * t["b"]) + s["c"] * t["c"]

    stacked = cv.tree.map(lambda *xs: np.stack(xs), *trees)
    want = cv.vmap(cv.grad(loss), axis_name="batch")(stacked)

    def program(group):
        return distributed.data_parallel(cv.jit(cv.grad(loss)), group=group)(trees[group.rank])

    results, errors, _ = run_group([program, program])
    assert errors == [None, None], errors
    for rank, got in enumerate(results):
        for key in ("a", "b", "c"):
            np.testing.assert_allclose(got[key], want[key][rank], rtol=1e-12, err_msg=key)
