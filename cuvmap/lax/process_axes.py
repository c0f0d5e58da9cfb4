"""Named axes whose members are processes: the bridge between the collectives of
:mod:`cuvmap.lax.parallel` and a process group.

``cuvmap.distributed.data_parallel(f, axis_name)`` binds a name to a process group (a frame
of the axis environment with a ``communicator``; NOTE [named axes] in :mod:`cuvmap.core`).
A collective resolves its names here (:func:`resolve_names`): a vmap's name stays a name,
processed by that vmap's batching rule; a name bound to processes becomes a
:class:`ProcessAxis`, which the collective binds in place of the name, and whose
communicator its eval impl calls (:func:`communicator_of`). The communicator's methods are
the :class:`cuvmap.distributed.engine.Communicator` protocol; this module imports nothing
from :mod:`cuvmap.distributed` (the floors: lax lies below it).
"""
from cuvmap import core
from cuvmap.core import Primitive, ShapeError


class ProcessAxis:
    """A named axis whose members are processes: the name and the process group
    (``communicator``) that ``cuvmap.distributed.data_parallel`` bound it to. A collective
    binds it in place of the name, so that the staged equation of a jitted program, and a
    backward pass that runs after ``data_parallel`` returned, still reach the group.

    The communicator is anything with the methods of
    :class:`cuvmap.distributed.engine.Communicator` (a :class:`typing.Protocol`):
    :class:`cuvmap.distributed.ProcessGroup`, which checks that the processes agree on
    each collective before its engine (:class:`cuvmap.distributed.engine.Engine`) moves
    the bytes."""

    __slots__ = ("name", "communicator")

    def __init__(self, name, communicator):
        self.name = name
        self.communicator = communicator

    @property
    def size(self):
        return self.communicator.size

    def __eq__(self, other):
        return type(other) is ProcessAxis and other.name == self.name and other.communicator is self.communicator

    def __hash__(self):
        return hash((self.name, id(self.communicator)))

    def __repr__(self):
        return f"{self.name!r}(processes={self.communicator.size})"


def resolve_names(axis_name, op, single=False):
    """``axis_name`` (a name or a tuple of names) as a tuple of names, each resolved in the
    axis environment: a name bound to processes becomes its :class:`ProcessAxis`. Raises
    :class:`~cuvmap.core.UnboundAxisError` naming an unbound name."""
    if type(axis_name) is str:  # the common case: one name
        frame = core.axis_frame(axis_name, op)
        return (axis_name if frame.communicator is None else ProcessAxis(axis_name, frame.communicator),)
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    if not names:
        raise ShapeError(f"{op}: axis_name must name at least one axis, got {axis_name!r}")
    if single and len(names) != 1:
        raise ShapeError(f"{op} acts along one named axis, got the names {names!r}")
    if len(set(names)) != len(names):
        raise ShapeError(f"{op}: axis_name {axis_name!r} repeats a name")
    out = []
    for name in names:
        if type(name) is ProcessAxis:
            out.append(name)
            continue
        if name is None:
            raise ShapeError(f"{op}: axis_name must be a name (a string), got None")
        frame = core.axis_frame(name, op)
        out.append(name if frame.communicator is None else ProcessAxis(name, frame.communicator))
    return tuple(out)


def axis_size(axis):
    """The number of members of a resolved axis name (a vmap's name or a ProcessAxis)."""
    if type(axis) is ProcessAxis:
        return axis.size
    return core.axis_frame(axis).size


def communicator_of(axis, op):
    """The communicator of ``axis`` for an eval impl; a vmap's name never reaches one (its
    batching rule consumes it), except when a program is evaluated outside that vmap."""
    if type(axis) is ProcessAxis:
        return axis.communicator
    raise core.UnboundAxisError(
        f"{op} over the axis {axis!r} was evaluated outside the vmap that binds that name (a "
        "collective over a vmap's axis is computed by that vmap's batching rule)")


class CollectivePrimitive(Primitive):
    """A primitive acting along named axes: ``axis_mains`` returns the batching transforms
    that bind the names in ``params[names_param]``, so that ``bind`` lets them process it
    (NOTE [named axes] in :mod:`cuvmap.core`). ``host_sync``: a program with a collective
    is never captured as a CUDA graph (its order across processes is the program's order
    of calls, and NCCL's kernels read the host-side communicator)."""

    __slots__ = ("names_param",)
    host_sync = True

    def __init__(self, name, names_param, differentiable=True):
        super().__init__(name, differentiable)
        self.names_param = names_param

    def axis_names(self, params):
        """The names in ``params`` that vmaps bind (not the process axes)."""
        names = params[self.names_param]
        if type(names) is not tuple:
            names = (names,)
        return {n for n in names if type(n) is not ProcessAxis}

    def axis_mains(self, params):
        return [core.axis_frame(n, self.name).main for n in self.axis_names(params)]


def across_processes(names):
    """Whether ``names`` (resolved) are all axes of processes, more than one process in all."""
    size = 1
    for name in names:
        if type(name) is not ProcessAxis:
            return False
        size *= name.size
    return size > 1
