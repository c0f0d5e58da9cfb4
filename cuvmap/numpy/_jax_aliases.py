"""``jax.numpy`` names that are NumPy's own objects (issue 32, the mirror's gaps): the dtype
aliases ``complex_``, ``cdouble``, ``csingle``, ``double``, ``single`` and ``object_``;
printing (``array_repr``, ``array_str``, ``printoptions``, ``get_printoptions``,
``set_printoptions``); ``iterable``; ``ComplexWarning``; and files (``save``, ``savez``,
``load``). cuvmap's arrays are NumPy's (or CuPy's), so these act on them directly; given
a tracer, the ones that read values raise cuvmap's ConcretizationError as ``np.asarray``
does.
"""
import numpy as np

complex_ = np.complex128
cdouble = np.complex128
csingle = np.complex64
double = np.float64
single = np.float32
object_ = np.object_

array_repr = np.array_repr
array_str = np.array_str
printoptions = np.printoptions
get_printoptions = np.get_printoptions
set_printoptions = np.set_printoptions
iterable = np.iterable
save = np.save
savez = np.savez
load = np.load  # NumPy arrays are cuvmap's arrays (JAX's jnp.load returns a device array)

try:
    ComplexWarning = np.exceptions.ComplexWarning
except AttributeError:  # NumPy < 1.25
    ComplexWarning = np.ComplexWarning

