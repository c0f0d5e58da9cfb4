"""``cupy.cuda.compiler`` of the stand-in: the exception a kernel that cannot compile raises."""
from cupy._kernel import CompileException  # noqa: F401
