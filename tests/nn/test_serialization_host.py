"""cygemm.nn's file format and torch export, the parts that run on the host (CPU): the torch
names and layout of an MLP's parameters against a float64 forward written out by hand, the
checks that refuse a wrong state before anything is written, and a file that is not cygemm's."""
import numpy as np
import pytest

from cygemm.nn import serialization
from cygemm.nn._storage import parse_precision


def _host_mlp(rng, sizes):
    """A state dict as MLP.state_dict() gives it: layers.{k}.weight (out, in), layers.{k}.bias."""
    state = {}
    for k, (i, o) in enumerate(zip(sizes[:-1], sizes[1:])):
        state[f"layers.{k}.weight"] = rng.standard_normal((o, i)).astype(np.float32)
        state[f"layers.{k}.bias"] = rng.standard_normal(o).astype(np.float32)
    return state


def _forward64(state, acts, x):
    """The MLP's forward in float64: x @ W.T + b, then each layer's activation."""
    fns = {"relu": lambda z: np.maximum(z, 0), "tanh": np.tanh, "none": lambda z: z,
           "silu": lambda z: z / (1 + np.exp(-z)),
           "gelu": lambda z: 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))}
    x = np.asarray(x, np.float64)
    for k, act in enumerate(acts):
        x = fns[act](x @ state[f"layers.{k}.weight"].astype(np.float64).T + state[f"layers.{k}.bias"])
    return x


@pytest.mark.parametrize("acts", [["relu", "relu", "none"], ["gelu", "none", "tanh"], ["silu", "relu"]])
def test_torch_export_loads_into_sequential_and_computes_the_mlp(acts):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    sizes = [7, 11, 5, 3][:len(acts) + 1]
    state = _host_mlp(rng, sizes)
    tsd = serialization.torch_state(state, [(f"layers.{k}.", a) for k, a in enumerate(acts)])
    # Each Linear sits at its index in the Sequential; an activation module (unless "none") follows it.
    expected_index, index = [], 0
    for a in acts:
        expected_index.append(index)
        index += 1 if a == "none" else 2
    assert list(tsd) == [f"{i}.{p}" for i in expected_index for p in ("weight", "bias")]
    seq = serialization.to_torch(tsd, sizes, acts, True)
    assert [type(m).__name__ for m in seq if type(m).__name__ == "Linear"] == ["Linear"] * len(acts)
    x = rng.standard_normal((6, sizes[0])).astype(np.float32)
    with torch.no_grad():
        out = seq.double()(torch.from_numpy(x).double()).numpy()
    ref = _forward64(state, acts, x)
    assert np.abs(out - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max())


def test_torch_state_of_a_single_layer_has_linears_names():
    pytest.importorskip("torch")
    w, b = np.ones((3, 2), np.float32), np.arange(3, dtype=np.float32)
    tsd = serialization.torch_state({"weight": w, "bias": b}, [("", "relu")], sequential=False)
    assert list(tsd) == ["weight", "bias"]
    assert tsd["weight"].shape == (3, 2) and tsd["bias"].tolist() == [0.0, 1.0, 2.0]


def test_check_keys_names_missing_and_unexpected_entries():
    with pytest.raises(KeyError, match=r"missing \['layers.1.bias'\], unexpected \['layers.2.bias'\]"):
        serialization.check_keys({"layers.0.weight": 0, "layers.2.bias": 0},
                                 ["layers.0.weight", "layers.1.bias"], "MLP")
    with pytest.raises(TypeError, match="state: expected a mapping of names to arrays, got list"):
        serialization.check_keys([1, 2], ["a"], "MLP")


def test_host_float32_checks_shape_and_kind_and_converts():
    out = serialization.host_float32(np.arange(6, dtype=np.float64).reshape(2, 3), "layers.0.weight", (2, 3))
    assert out.dtype == np.float32 and out.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match=r"layers.0.weight: expected shape \(3, 2\), got \(2, 3\)"):
        serialization.host_float32(np.zeros((2, 3)), "layers.0.weight", (3, 2))
    with pytest.raises(TypeError, match="bias: expected real numbers, got dtype <U1"):
        serialization.host_float32(np.array(["a"]), "bias", (1,))


def test_load_refuses_a_file_cygemm_did_not_write(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, weight=np.zeros(3))
    with pytest.raises(ValueError, match=r"expected a file cygemm.nn.save wrote \(format 'cygemm.nn/1'\), "
                                          r"got format ''"):
        serialization.load(path, model=None)


def test_precision_names():
    assert parse_precision("fp32") == "fp32"
    assert parse_precision("bf16-mixed") == parse_precision("bf16") == "bf16-mixed"
    assert parse_precision("fp8-block") == "fp8-block"
    with pytest.raises(ValueError, match="precision: expected one of 'fp32', 'bf16-mixed', 'fp8-tensor', "
                                         "'fp8-rowwise', 'fp8-block', got 'fp16'"):
        parse_precision("fp16")
