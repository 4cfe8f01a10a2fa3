"""Saving and loading cygemm.nn models and optimizers (GPU): a compiled step continues bit for
bit from a loaded state (in fp32 and bf16-mixed, every optimizer), loading writes into the
existing buffers, bad states are refused before anything is written, and the torch export
computes what the model computes (float64 reference)."""
import numpy as np
import pytest

from gpu_util import f64, rel_err

pytestmark = pytest.mark.gpu


def _optimizer(nn, name, model):
    sched = dict(schedule="cosine", total_steps=40, warmup_steps=3)
    if name == "SGD":
        return nn.SGD(model, lr=0.05, momentum=0.9, nesterov=True, **sched)
    return getattr(nn, name)(model, lr=1e-2, weight_decay=0.01, **sched)


def _batches(rng, n, batch=16, d=20, c=5):
    return [(rng.standard_normal((batch, d)).astype(np.float32), rng.integers(0, c, batch)) for _ in range(n)]


def _pointers(model, opt):
    arrays = [model.flat_parameters, model.flat_gradients, *opt.state(), opt.lr]
    if model.flat_parameters_bf16 is not None:
        arrays.append(model.flat_parameters_bf16)
    return [a.data.ptr for a in arrays]


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_compiled_step_continues_bit_for_bit_from_a_loaded_state(tmp_path, opt_name, precision):
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    data = _batches(rng, 14)
    model = nn.MLP([20, 32, 32, 5], act="relu", seed=int(rng.integers(1 << 30)), precision=precision)
    opt = _optimizer(nn, opt_name, model)
    step = nn.compile_step(model, nn.SoftmaxCrossEntropy(), opt, batch=16)
    assert step.graph is not None
    pointers = _pointers(model, opt)
    for x, y in data[:6]:
        step(x, y)
    path = tmp_path / "run.npz"
    nn.save(path, model, opt)
    want_losses = [float(step(x, y)) for x, y in data[6:]]
    want_params = model.flat_parameters.get()
    want_state = opt.state_dict()
    # Perturb every part of the state, the bfloat16 copy too, then load.
    with step.stream:
        params = model.flat_parameters                  # a view of the buffer: changed in place
        params += 0.25
        opt.steps.fill(33)
        for buf in opt.state()[2:]:
            buf *= 3.0
    model.refresh_bf16(step.stream)
    nn.load(path, model, opt)
    assert _pointers(model, opt) == pointers                  # loaded into the buffers the graph reads
    assert int(opt.steps.get()) == 6
    got_losses = [float(step(x, y)) for x, y in data[6:]]
    assert got_losses == want_losses
    assert np.array_equal(model.flat_parameters.get(), want_params)
    got_state = opt.state_dict()
    assert sorted(got_state) == sorted(want_state)
    for k in want_state:
        assert np.array_equal(got_state[k], want_state[k]), k
    if precision == "bf16-mixed":
        import ml_dtypes
        copy = model.flat_parameters_bf16.get()
        assert np.array_equal(copy.view(np.uint16), want_params.astype(ml_dtypes.bfloat16).view(np.uint16))
    cp.cuda.Device().synchronize()


def test_state_dict_names_layout_and_in_place_load():
    import cupy as cp
    import cygemm.nn as nn
    rng = np.random.default_rng()
    model = nn.MLP([6, 9, 4], seed=1)
    state = model.state_dict()
    assert list(state) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]
    assert state["layers.1.weight"].shape == (4, 9) and state["layers.1.weight"].dtype == np.float32
    assert np.array_equal(state["layers.0.weight"], model.layers[0].weight.get())
    new = {k: rng.standard_normal(v.shape).astype(np.float64) for k, v in state.items()}
    ptr = model.flat_parameters.data.ptr
    model.load_state_dict({**new, "layers.1.bias": cp.asarray(new["layers.1.bias"])})
    assert model.flat_parameters.data.ptr == ptr
    for k, layer_part in (("layers.0.weight", model.layers[0].weight), ("layers.1.bias", model.layers[1].bias)):
        assert np.array_equal(layer_part.get(), new[k].astype(np.float32))
    assert np.array_equal(model.layers[1].state_dict()["weight"], new["layers.1.weight"].astype(np.float32))


def test_bad_states_are_refused_before_anything_is_written():
    import cygemm.nn as nn
    model = nn.MLP([6, 9, 4], seed=2)
    opt = nn.Adam(model, lr=1e-3, betas=(0.9, 0.99))
    before = model.flat_parameters.get()
    state = model.state_dict()
    bad = dict(state, **{"layers.1.weight": np.zeros((9, 4), np.float32)})
    with pytest.raises(ValueError, match=r"layers.1.weight: expected shape \(4, 9\), got \(9, 4\)"):
        model.load_state_dict(dict(bad, **{"layers.0.weight": state["layers.0.weight"] + 1}))
    with pytest.raises(KeyError, match=r"missing \['layers.1.bias'\]"):
        model.load_state_dict({k: v for k, v in state.items() if k != "layers.1.bias"})
    assert np.array_equal(model.flat_parameters.get(), before)
    other = nn.Adam(model, lr=1e-3, betas=(0.9, 0.999)).state_dict()
    with pytest.raises(ValueError, match=r"betas: the state was saved with \[0.9, 0.999\], this optimizer has "):
        opt.load_state_dict(other)
    with pytest.raises(ValueError, match="state: saved by AdamW, loading into Adam"):
        opt.load_state_dict(nn.AdamW(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0).state_dict())
    assert int(opt.steps.get()) == 0


def test_torch_export_computes_what_the_model_computes():
    import cupy as cp
    import cygemm.nn as nn
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    model = nn.MLP([12, 16, 16, 3], act="gelu", seed=3, math="fp32")
    seq = model.to_torch().double()
    assert [type(m).__name__ for m in seq] == ["Linear", "GELU", "Linear", "GELU", "Linear"]
    x = rng.standard_normal((9, 12)).astype(np.float32)
    with torch.no_grad():
        ref = seq(torch.from_numpy(x).double()).numpy()
    assert rel_err(f64(cp, model.predict(cp.asarray(x))), ref) < 1e-5
    linear = torch.nn.Linear(16, 3)
    linear.load_state_dict(model.layers[2].torch_state_dict())
    assert np.array_equal(linear.weight.detach().numpy(), model.layers[2].weight.get())
