"""How -m "not slow" samples a large table of cases: every ``every``-th case runs there and
the others carry the ``slow`` mark (the README's full command runs them all). The choice is
by position, so a sample is the same on every run and every machine."""
import itertools

import pytest


def sampled(cases, every, ids=None):
    """``cases`` as ``pytest.param``s, all but every ``every``-th (from the first) marked
    slow. A case that is already a ``pytest.param`` keeps its marks and id."""
    out = []
    for i, case in enumerate(cases):
        marks = () if i % every == 0 else (pytest.mark.slow,)
        if isinstance(case, type(pytest.param(None))):
            out.append(pytest.param(*case.values, marks=(*case.marks, *marks), id=case.id))
        else:
            values = case if isinstance(case, tuple) else (case,)
            out.append(pytest.param(*values, marks=marks, id=None if ids is None else ids[i]))
    return out


def product(*axes):
    """The cases of the cartesian product of ``axes`` (what stacked ``parametrize``
    decorators give), as tuples."""
    return list(itertools.product(*axes))
