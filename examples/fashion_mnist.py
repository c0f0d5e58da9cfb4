"""Fashion-MNIST (Xiao et al. 2017: 60,000 training and 10,000 test 28×28 grey images of 10
kinds of clothing) from its standard IDX files, as float32 arrays ``(N, 1, 28, 28)`` scaled
to [0, 1] (torchvision's ``ToTensor``, what Tramèr & Boneh trained on) and int64 labels.

The files: ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
``t10k-images-idx3-ubyte.gz``, ``t10k-labels-idx1-ubyte.gz`` (gzipped or not), in the
directory given, by default where Debian's ``dataset-fashion-mnist`` package puts them.

The IDX format (LeCun's, used by MNIST and Fashion-MNIST): a big-endian header of two zero
bytes, a type byte (``0x08``: unsigned bytes) and the number of dimensions ``d``, then ``d``
big-endian uint32 sizes, then the data in C order.
"""
import gzip
import os

import numpy as np

import cuvmap as cv

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle boot")
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class DatasetMissing(SystemExit):
    """The IDX files are not where they were looked for (a clean exit with the two ways to get them)."""


def read_idx(path):
    """The array an IDX file holds (``path`` may end in ``.gz``), with its header checked."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise ValueError(f"read_idx: {path} is not an IDX file (its header starts {data[:4]!r})")
    dtype, ndim = np.dtype(_IDX_TYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(f"read_idx: {path} holds {len(data)} bytes, but its header {shape} of {dtype} "
                         f"says {expected} (a truncated or corrupted file)")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find(directory, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise DatasetMissing(
        f"Fashion-MNIST: {stem}(.gz) is not in {directory}. Either install Debian's package "
        f"(sudo apt-get install dataset-fashion-mnist, which puts the files in {DEFAULT_DIR}), or download "
        f"the four IDX files from https://github.com/zalandoresearch/fashion-mnist (data/fashion) and pass "
        f"--data DIR")


def load_split(directory, split):
    """``(images, labels)`` of ``split`` ("train" or "test"): float32 ``(N, 1, 28, 28)`` in
    [0, 1] and int64 ``(N,)``, checked against each other."""
    images_stem, labels_stem = FILES[split]
    images, labels = read_idx(_find(directory, images_stem)), read_idx(_find(directory, labels_stem))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"Fashion-MNIST {split}: images {images.shape} and labels {labels.shape} do not pair up "
                         f"(want (N, rows, cols) and (N,))")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise ValueError(f"Fashion-MNIST {split}: labels outside 0..{len(CLASSES) - 1}")
    x = (images.astype(np.float32) / 255.0)[:, None]
    return x, labels.astype(np.int64)


def load_fashion_mnist(directory=DEFAULT_DIR, device="cpu"):
    """Returns ``(x_train, y_train, x_test, y_test)`` on ``device``."""
    x_train, y_train = load_split(directory, "train")
    x_test, y_test = load_split(directory, "test")
    return tuple(cv.device_put(a, device) for a in (x_train, y_train, x_test, y_test))
