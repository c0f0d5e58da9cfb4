"""CPU-only parts: the oneDNN binding (``onednn.py``). Never imports the transforms."""
