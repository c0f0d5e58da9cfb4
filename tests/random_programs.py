"""Random programs for property tests of the staged-program machinery (the planner in
tests/jit/test_jit.py, fusion in tests/jit/test_fusion.py).

A program takes ``num_inputs`` arrays; each step applies a unary or binary op (from the
lists the test passes) to earlier values, and the outputs are a few of the values.
"""
from hypothesis import strategies as st


@st.composite
def programs(draw, num_unary, num_binary, num_inputs=1, max_steps=12):
    """A program's spec: ``(steps, outs)``, step ``("u", op, a)`` or ``("b", op, a, b)``
    over value indices (the inputs first)."""
    n = draw(st.integers(1, max_steps))
    last = num_inputs - 1
    steps = []
    for k in range(n):
        if draw(st.booleans()):
            steps.append(("u", draw(st.integers(0, num_unary - 1)), draw(st.integers(0, k + last))))
        else:
            steps.append(("b", draw(st.integers(0, num_binary - 1)), draw(st.integers(0, k + last)),
                          draw(st.integers(0, k + last))))
    outs = draw(st.lists(st.integers(0, n + last), min_size=1, max_size=3))
    return steps, outs


def program_fun(spec, unary, binary):
    """The Python function of a spec: ``f(*inputs) -> tuple of the chosen values``."""
    steps, outs = spec

    def f(*inputs):
        values = list(inputs)
        for s in steps:
            if s[0] == "u":
                values.append(unary[s[1]](values[s[2]]))
            else:
                values.append(binary[s[1]](values[s[2]], values[s[3]]))
        return tuple(values[i] for i in outs)

    return f
