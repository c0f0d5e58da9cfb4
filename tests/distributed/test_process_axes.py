"""The bridge between the collectives and a process group (issue 35): the interface a
group offers ``lax`` is a Protocol beside ``Engine`` (``cuvmap.distributed.Communicator``),
which ``ProcessGroup`` satisfies and a ``ProcessAxis`` holds; the collectives' module and
the bridge are separate files, each under the house's 700 lines."""
import pathlib

import numpy as np

import cuvmap as cv
from cuvmap import distributed, lax
from cuvmap.lax import parallel, process_axes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_process_group_is_a_communicator():
    group = distributed.ProcessGroup()
    assert isinstance(group, distributed.Communicator)
    seen = []

    def f(x):
        seen.append(process_axes.resolve_names("batch", "psum"))
        return lax.psum(x, "batch")

    out = distributed.data_parallel(f, group=group)(np.arange(3.0))
    np.testing.assert_array_equal(out, np.arange(3.0))
    ((axis,),) = seen
    assert type(axis) is process_axes.ProcessAxis and axis.communicator is group and axis.size == 1
    # a vmap's name stays a name (its batching rule processes the collective)
    names = []
    cv.vmap(lambda x: names.append(process_axes.resolve_names("i", "psum")) or x, axis_name="i")(np.ones(2))
    assert names == [("i",)]


def test_the_collectives_keep_their_import_paths():
    for name in ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all",
                 "axis_index"):
        assert getattr(lax, name) is getattr(parallel, name)
        if name != "pmean":  # (a psum divided)
            assert isinstance(getattr(parallel, name + "_p"), process_axes.CollectivePrimitive)
    assert parallel.ProcessAxis is process_axes.ProcessAxis
    assert len(parallel.collective_primitives()) == 8  # (pmean is a psum divided)


def test_the_collective_modules_stay_under_700_lines():
    for name in ("parallel.py", "process_axes.py", "collective_operands.py"):
        lines = len((ROOT / "cuvmap" / "lax" / name).read_text().splitlines())
        assert lines <= 700, (name, lines)
