"""``cupyx.scipy`` of the strict CuPy stand-in (``special`` only)."""
