"""GPU-only parts (cuDNN binding, device probing, kernels). Never imports the transforms."""
