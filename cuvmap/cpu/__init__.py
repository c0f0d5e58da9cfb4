"""CPU-only parts: the oneDNN binding (``onednn.py``: the convolution plans, on the ctypes
layer ``libdnnl.py`` and the OpenMP environment ``openmp.py``) and the thread counts
(``threads.py``). Never imports the transforms."""
