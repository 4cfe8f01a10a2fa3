"""CPU: the tests' own references (tests/refs) against what defines them: each activation's
derivative against central differences of the activation, and values any table gives."""
import numpy as np
import pytest

from refs import activations, rows


@pytest.mark.parametrize("name", activations.NAMES)
def test_each_derivative_is_the_activations_slope(name):
    z = np.concatenate([np.linspace(-6, -0.01, 300), np.linspace(0.01, 6, 300)])   # off relu's kink
    h = 1e-6
    diff = (activations.act(name, z + h, 0.07) - activations.act(name, z - h, 0.07)) / (2 * h)
    np.testing.assert_allclose(activations.act_grad(name, z, 0.07), diff, rtol=1e-7, atol=1e-8)


def test_activation_values_from_their_definitions():
    assert activations.act("gelu_erf", np.array([0.0, 1.0]))[1] == pytest.approx(0.8413447460685429)
    assert activations.act("sigmoid", np.array([-800.0, 0.0, 800.0])).tolist() == [0.0, 0.5, 1.0]
    assert activations.act("leaky_relu", np.array([-2.0, 3.0]), 0.1).tolist() == [-0.2, 3.0]
    x = np.array([[1e4, -1e4, 0.0], [1.0, 2.0, 3.0]])
    assert rows.softmax(x)[0].tolist() == [1.0, 0.0, 0.0] and rows.log_softmax(x)[0, 1] == -2e4
    np.testing.assert_allclose(rows.softmax(x)[1], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum(), rtol=1e-15)
