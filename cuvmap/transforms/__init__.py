"""The transforms: each module owns its tracer, its trace and its rule registry."""
