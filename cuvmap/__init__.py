"""cuvmap: JAX-style composable function transformations over NumPy and CuPy arrays.

Re-exports only; see ``cuvmap.api`` and ``cuvmap.jit_api`` for the transforms, ``cuvmap.numpy`` for the
NumPy-like functions and ``cuvmap.lax`` for the primitives.
"""
from cuvmap import config, lax, tree  # noqa: F401
from cuvmap import dp, nn  # noqa: F401
from cuvmap import numpy  # noqa: F401  (attaches the tracer operators)
from cuvmap import custom_batching, debug, flatten_util, profiler, random  # noqa: F401
from cuvmap.api import (  # noqa: F401
    block_until_ready, grad, hessian, jacfwd, jacrev, jvp, stop_gradient, value_and_grad, vjp, vmap,
)
from cuvmap.api_util import TransformError  # noqa: F401
from cuvmap.jit_api import RetraceWarning, eval_shape, jit, make_jaxpr  # noqa: F401
from cuvmap.scope import named_scope  # noqa: F401
from cuvmap.lax.callbacks import CallbackError, pure_callback  # noqa: F401
from cuvmap.transforms.linearize import linearize  # noqa: F401
from cuvmap.transforms.remat import checkpoint, checkpoint_policies, remat  # noqa: F401
from cuvmap.backend import device_put, gpu_available  # noqa: F401
from cuvmap.transforms.custom_derivatives import CustomDerivativeError, custom_jvp, custom_vjp  # noqa: F401
from cuvmap.core import (  # noqa: F401
    ConcretizationError, CuvmapError, EscapedTracerError, MissingRuleError, ShapeDtypeStruct, ShapeError,
)
# autodiff options (issue 33): JAX's custom-derivative helpers, checkpoint names, float0
from cuvmap import custom_derivatives, dtypes  # noqa: F401
from cuvmap.dtypes import float0  # noqa: F401
from cuvmap.transforms.checkpoint_name import checkpoint_name  # noqa: F401
from cuvmap.transforms.custom_gradient import closure_convert, custom_gradient  # noqa: F401
# JAX's refusals, configuration context managers and device queries (branch loops)
from cuvmap.api_util import AuxOutputError, GradOutputError, OutputTypeError  # noqa: F401
from cuvmap.jax_settings import (  # noqa: F401
    Device, checking_leaks, debug_infs, debug_nans, default_backend, default_matmul_precision, device_count,
    devices, disable_jit, enable_checks, enable_x64, local_device_count, local_devices, numpy_dtype_promotion,
    numpy_rank_promotion,
)

# issue 32 (apisurf): jax.Array, ensure_compile_time_eval, transfer guards, named_call, device_get
from cuvmap.api_extras import Array, device_get, ensure_compile_time_eval, named_call, pmap  # noqa: F401
from cuvmap.api_extras import print_environment_info  # noqa: F401
from cuvmap.linear_maps import linear_transpose  # noqa: F401
from cuvmap.jit_api import clear_caches  # noqa: F401, E402  (issue 32: the mirror's gaps)
from cuvmap.api import jacrev as jacobian  # noqa: F401, E402  (JAX's alias of jacrev)
from cuvmap.transfer_guards import (  # noqa: F401
    TransferGuardError, transfer_guard, transfer_guard_device_to_device, transfer_guard_device_to_host,
    transfer_guard_host_to_device,
)

__version__ = "0.1.0"
