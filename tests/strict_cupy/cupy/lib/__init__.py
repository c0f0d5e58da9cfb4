"""``cupy.lib`` of the strict CuPy stand-in (``stride_tricks`` only)."""
from cupy.lib import stride_tricks  # noqa: F401
