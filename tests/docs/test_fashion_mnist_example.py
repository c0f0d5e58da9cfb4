"""The Fashion-MNIST example (issue 37): its IDX loader on small files this test writes (gzipped
and not, every header fault), the message when the files are missing, the accounting of the
paper's settings against dp_accounting's figures, and a tiny run end to end. The full
40-epoch run is not a test: its record is in docs/performance/data/fashion_mnist.json."""
import gzip
import json
import struct

import numpy as np
import pytest

from tests.docs.test_examples import load, run_example

fashion_mnist = load("fashion_mnist")


def write_idx(path, array, compress):
    """An IDX file of uint8 ``array``: two zero bytes, type 0x08, the rank, big-endian sizes, the data."""
    raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(str(path) + (".gz" if compress else ""), "wb").write(raw)


def write_dataset(directory, n_train=48, n_test=24, compress=True, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        labels = rng.integers(0, 10, n)
        # each class a distinct bright square, so that even a tiny run can learn something
        images = rng.integers(0, 40, (n, 28, 28))
        for i, c in enumerate(labels):
            images[i, 2 * c:2 * c + 8, 2 * c:2 * c + 8] = 250
        images_stem, labels_stem = fashion_mnist.FILES[split]
        write_idx(directory / images_stem, images, compress)
        write_idx(directory / labels_stem, labels, compress)
        arrays[split] = (images, labels)
    return arrays


@pytest.mark.parametrize("compress", [True, False], ids=["gz", "plain"])
def test_the_loader_reads_idx_files_back(tmp_path, compress):
    arrays = write_dataset(tmp_path, compress=compress)
    x_train, y_train, x_test, y_test = fashion_mnist.load_fashion_mnist(str(tmp_path))
    for (images, labels), x, y in ((arrays["train"], x_train, y_train), (arrays["test"], x_test, y_test)):
        assert x.shape == (len(labels), 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
        np.testing.assert_array_equal(x[:, 0], images.astype(np.float32) / 255.0)
        np.testing.assert_array_equal(y, labels)
        assert 0.0 <= x.min() and x.max() <= 1.0


def test_read_idx_reads_other_types_and_ranks(tmp_path):
    values = np.arange(-6, 6, dtype=">i4").reshape(3, 4)
    raw = bytes([0, 0, 0x0C, 2]) + struct.pack(">2I", 3, 4) + values.tobytes()
    (tmp_path / "ints").write_bytes(raw)
    got = fashion_mnist.read_idx(str(tmp_path / "ints"))
    np.testing.assert_array_equal(got, np.arange(-6, 6).reshape(3, 4))
    assert got.dtype == np.int32 and got.dtype.isnative


@pytest.mark.parametrize("corrupt, message", [
    (lambda raw: b"\x01" + raw[1:], "is not an IDX file"),
    (lambda raw: raw[:2] + b"\x07" + raw[3:], "is not an IDX file"),
    (lambda raw: raw[:-5], "truncated or corrupted"),
    (lambda raw: raw + b"\x00", "truncated or corrupted"),
], ids=["magic", "type", "short", "long"])
def test_read_idx_refuses_a_bad_file(tmp_path, corrupt, message):
    write_idx(tmp_path / "images", np.zeros((2, 28, 28)), compress=False)
    (tmp_path / "images").write_bytes(corrupt((tmp_path / "images").read_bytes()))
    with pytest.raises(ValueError, match=message):
        fashion_mnist.read_idx(str(tmp_path / "images"))


def test_images_and_labels_that_do_not_pair_up_are_refused(tmp_path):
    write_dataset(tmp_path, compress=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5), compress=False)
    with pytest.raises(ValueError, match=r"do not pair up"):
        fashion_mnist.load_split(str(tmp_path), "train")


@pytest.mark.slow
def test_missing_files_name_both_ways_to_get_them(tmp_path):
    with pytest.raises(fashion_mnist.DatasetMissing) as info:
        fashion_mnist.load_fashion_mnist(str(tmp_path))
    text = str(info.value)
    assert str(tmp_path) in text and "apt-get install dataset-fashion-mnist" in text and "--data DIR" in text
    # as a command: the message, no traceback
    result = run_example("dp_fashion_mnist", "--data", str(tmp_path))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "dataset-fashion-mnist" in result.stderr + result.stdout


def test_the_papers_settings_account_as_dp_accounting_does():
    """The issue's figures for expected batch 2048 of 60,000, σ = 2.15, 40 epochs (⌈40/q⌉ =
    1172 Poisson steps), δ = 1e-5, from Google's dp_accounting: ε 2.6055 by RDP, 2.3895 by PLD."""
    module = load("dp_fashion_mnist")
    paper = module.PAPER
    q = paper["batch"] / 60000
    steps = int(np.ceil(paper["epochs"] / q))
    assert steps == 1172
    from cuvmap import dp
    plan = dp.Plan(dataset_size=60000, sample_rate=q, noise_multiplier=paper["noise"], max_norm=paper["max_norm"],
                   steps=steps, expected_batch_size=paper["batch"])
    eps = plan.epsilons(paper["delta"])
    assert eps["rdp"] == pytest.approx(2.6055, abs=2e-3) and eps["pld"] == pytest.approx(2.3895, abs=2e-3)
    assert eps["pld"] < paper["epsilon"]


def test_the_network_is_the_papers(tmp_path):
    """26,010 parameters: conv 16·(1·8·8)+16, conv 32·(16·4·4)+32, dense 512·32+32, dense 32·10+10."""
    module = load("dp_fashion_mnist")
    out_shape, params = module.MODEL.init(np.random.default_rng(0), (-1, 1, 28, 28))
    assert tuple(out_shape) == (-1, 10)
    assert module._size(params) == 16 * 64 + 16 + 32 * 256 + 32 + 512 * 32 + 32 + 32 * 10 + 10 == 26010


@pytest.mark.slow
def test_a_tiny_run_trains_accounts_and_records(tmp_path, capsys):
    write_dataset(tmp_path, n_train=64, n_test=32)
    record = load("dp_fashion_mnist").main(["--data", str(tmp_path), "--epochs", "2", "--batch", "32",
                                            "--noise", "0.5", "--max-norm", "1", "--lr", "0.5", "--progress", "off",
                                            "--json", str(tmp_path / "run.json")])
    out = capsys.readouterr().out
    assert "epoch   1: test accuracy" in out and "epoch   2: test accuracy" in out and "by Rényi DP" in out
    assert len(record["epochs"]) == 2 and record["steps"] == 4
    assert 0.0 <= record["test_accuracy"] <= 1.0
    assert 0 < record["epsilon_pld"] < record["epsilon_rdp"] and np.isfinite(record["epsilon_rdp"])
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["test_accuracy"] == record["test_accuracy"] and saved["settings"]["seed"] == 0
