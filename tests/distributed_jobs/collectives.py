"""Run under ``mpiexec -n N``: every collective over the axis of processes on NumPy arrays
of several dtypes and shapes (size 0 included), eagerly and under jit, against closed
forms that each process computes from every process's values (process r's operand is a
known function of r); then data-parallel gradients against the one-process gradient of
the whole batch, which each process also computes. Prints ``ok R`` on each process;
any failure raises, which aborts the job (non-zero exit)."""
import warnings

import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import distributed, lax

warnings.simplefilter("ignore", cv.RetraceWarning)  # one trace per dtype and shape, on purpose
group = distributed.initialize()
R, N = group.rank, group.size


def value(r, shape, dtype):
    """Process r's operand: distinct per process, exact in every dtype."""
    size = int(np.prod(shape, dtype=np.int64))
    v = (np.arange(size) % 7 + 3 * r + 1).reshape(shape)
    if np.dtype(dtype) == np.bool_:
        return (v % 2 == 0)
    if np.dtype(dtype).kind == "c":
        return (v + 1j * (r - v)).astype(dtype)
    return v.astype(dtype)


def check(got, want, what):
    got = np.asarray(got)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape}, expected {np.shape(want)}"
    assert got.dtype == np.asarray(want).dtype, f"{what}: dtype {got.dtype}, expected {np.asarray(want).dtype}"
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=what)


def reductions(x):
    out = {"psum": lax.psum(x, "batch")}
    if x.dtype.kind != "c":
        out["pmax"] = lax.pmax(x, "batch")
        out["pmin"] = lax.pmin(x, "batch")
    return out


SHAPES = [(), (0,), (5,), (2, 0, 3), (3, 4), (1000,)]
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.complex128, np.float16, np.bool_]
eager = distributed.data_parallel(reductions)
staged = distributed.data_parallel(cv.jit(reductions))
for dtype in DTYPES:
    for shape in SHAPES:
        values = [value(r, shape, dtype) for r in range(N)]
        x = values[R]
        want = {"psum": np.sum(np.stack(values), axis=0, dtype=np.int64 if dtype == np.bool_ else dtype)}
        if np.dtype(dtype).kind != "c":
            want["pmax"], want["pmin"] = np.max(np.stack(values), axis=0), np.min(np.stack(values), axis=0)
        for how, fn in (("eager", eager), ("jit", staged)):
            got = fn(x)
            for k in want:
                check(got[k], want[k], f"{k} of {np.dtype(dtype)}{list(shape)} ({how})")
# a non-contiguous operand
values = [value(r, (4, 3), np.float64) for r in range(N)]
check(eager(values[R].T)["psum"], sum(values).T, "psum of a transposed operand")

# the gathering collectives
values = [value(r, (N, 2 * N), np.float64) for r in range(N)]
x = values[R]
stack = np.stack(values)
shift = [(r, (r + 1) % N) for r in range(N)]


def gathers(x):
    return [lax.all_gather(x, "batch", axis=1), lax.psum_scatter(x, "batch"),
            lax.psum_scatter(x, "batch", scatter_dimension=1, tiled=True), lax.all_to_all(x, "batch", 0, 1),
            lax.ppermute(x, "batch", shift), lax.ppermute(x, "batch", [(0, N - 1)]), lax.axis_index("batch"),
            lax.pmean(x, "batch")]


wants = [np.moveaxis(stack, 0, 1), stack.sum(0)[R], stack.sum(0)[:, 2 * R:2 * R + 2],
         np.stack([values[c][R] for c in range(N)], axis=1), values[(R - 1) % N],
         values[0] if R == N - 1 else np.zeros_like(x), np.int32(R), stack.mean(0)]
for how, fn in (("eager", distributed.data_parallel(gathers)), ("jit", distributed.data_parallel(cv.jit(gathers)))):
    for k, (got, want) in enumerate(zip(fn(x), wants)):
        check(got, want, f"gathering collective {k} ({how})")

# data-parallel gradients: each process holds every N-th example of a batch of 12
xs = np.random.default_rng(0).standard_normal((12, 3))
ys = np.random.default_rng(1).standard_normal(12)
w = np.array([0.5, -0.2, 0.1])


def loss(w, x, y):
    return cnp.mean((cnp.tanh(x @ w) - y) ** 2)


want = cv.grad(loss)(w, xs, ys)  # one process, the whole batch
mine = (xs[R::N], ys[R::N])  # 12 / N examples here (N divides 12)
grad_step = distributed.data_parallel(lambda w, x, y: lax.pmean(cv.grad(loss)(w, x, y), "batch"))
check(grad_step(w, *mine), want, "pmean of the processes' gradients")
check(distributed.data_parallel(cv.jit(lambda w, x, y: lax.pmean(cv.grad(loss)(w, x, y), "batch")))(w, *mine), want,
      "the same under jit")
jit_outside = cv.jit(distributed.data_parallel(lambda w, x, y: lax.pmean(cv.grad(loss)(w, x, y), "batch")))
for _ in range(2):  # traced inside data_parallel, then run from the cache: the staged psum holds the group
    check(jit_outside(w, *mine), want, "jit of data_parallel")
# grad outside data_parallel: the psum's transpose all-reduces the cotangents, so the
# cotangent of each process's loss is psum(1 / N) = 1 (reverse mode differentiates the sum
# of every process's output)
total = distributed.data_parallel(lambda w, x, y: lax.psum(loss(w, x, y), "batch") / N)
check(cv.grad(lambda w: total(w, *mine))(w), cv.grad(loss)(w, *mine), "grad through psum")
print(f"ok {R}", flush=True)
