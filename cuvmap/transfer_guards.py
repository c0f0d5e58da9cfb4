"""``transfer_guard``: what happens to transfers between the host and a GPU (JAX's
``jax.transfer_guard`` and its three one-direction forms).

The levels: NOTE [transfer guard levels] below. This module imports nothing from cuvmap
(:mod:`cuvmap.backend` imports it).
"""
import contextlib
import logging
import threading

LEVELS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")
DIRECTIONS = ("host_to_device", "device_to_device", "device_to_host")

# NOTE [transfer guard levels]
# A transfer is *implicit* when cuvmap makes it on its own — a NumPy array meeting CuPy arrays
# in an operation, or a NumPy argument of a jitted GPU program (NOTE [host arrays meet device
# arrays] in cuvmap/backend.py) — and *explicit* when the user asks for it
# (:func:`cuvmap.device_put`). The level of each direction says what happens to each kind,
# as in JAX:
#
#   level                 implicit transfer   explicit transfer
#   allow                 made                made
#   log                   logged, made        made
#   disallow              raises              made
#   log_explicit          logged, made        logged, made
#   disallow_explicit     raises              raises
#
# The levels are thread-local and nest. On the CPU (NumPy arrays only) nothing is ever
# transferred, so no level changes anything; a CuPy array never goes to the host implicitly
# (CuPy refuses ``np.asarray`` of it), so ``device_to_host`` guards only ``device_put``;
# cuvmap never copies between GPUs (``device_put`` keeps a CuPy array where it is), so
# ``device_to_device`` is accepted and guards nothing. A jitted program's NumPy constants
# are part of the program (put on its GPU once, when it is planned), not a transfer.

_logger = logging.getLogger("cuvmap.transfer_guards")
_state = threading.local()


class TransferGuardError(RuntimeError):
    """A transfer that the current :func:`transfer_guard` level disallows."""


def level(direction):
    """The current level of ``direction`` (``"allow"`` when no guard is set)."""
    return getattr(_state, direction, "allow")


@contextlib.contextmanager
def _guard(directions, new_val, where):
    if new_val not in LEVELS:
        raise ValueError(f"{where}: the level must be one of {', '.join(map(repr, LEVELS))}, got {new_val!r}")
    previous = {d: getattr(_state, d, "allow") for d in directions}
    for d in directions:
        setattr(_state, d, new_val)
    try:
        yield
    finally:
        for d, v in previous.items():
            setattr(_state, d, v)


def transfer_guard(new_val):
    """Sets the level of every direction of transfer for the block (JAX's
    ``jax.transfer_guard``; the levels: NOTE [transfer guard levels])::

        with cuvmap.transfer_guard("disallow"):
            y = f(x_gpu)        # raises if f's NumPy constants would be copied to the GPU
    """
    return _guard(DIRECTIONS, new_val, "transfer_guard")


def transfer_guard_host_to_device(new_val):
    """The level of host-to-device transfers for the block (JAX's
    ``jax.transfer_guard_host_to_device``; NOTE [transfer guard levels])."""
    return _guard(("host_to_device",), new_val, "transfer_guard_host_to_device")


def transfer_guard_device_to_device(new_val):
    """The level of transfers between GPUs for the block (JAX's
    ``jax.transfer_guard_device_to_device``; NOTE [transfer guard levels])."""
    return _guard(("device_to_device",), new_val, "transfer_guard_device_to_device")


def transfer_guard_device_to_host(new_val):
    """The level of device-to-host transfers for the block (JAX's
    ``jax.transfer_guard_device_to_host``; NOTE [transfer guard levels])."""
    return _guard(("device_to_host",), new_val, "transfer_guard_device_to_host")


def check(direction, explicit, what):
    """Called before a transfer is made: logs it or raises :class:`TransferGuardError`
    as the level of ``direction`` says for an explicit or implicit transfer (``what``
    describes it)."""
    lv = level(direction)
    kind = "explicit" if explicit else "implicit"
    if lv == "disallow_explicit" or (lv == "disallow" and not explicit):
        raise TransferGuardError(f"Disallowed {direction.replace('_', '-')} transfer ({kind}): {what}; "
                                 f"the transfer guard level is {lv!r}")
    if lv == "log_explicit" or (lv == "log" and not explicit):
        _logger.warning("%s transfer (%s): %s", direction.replace("_", "-"), kind, what)
