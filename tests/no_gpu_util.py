"""What the no-GPU tests of cygemm.nn and cygemm.backend share: the examples folder, a child
interpreter's environment that imports the cygemm under test, and the reason cygemm gives."""
import os

import cygemm

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def child_env():
    """The environment of a child interpreter: this cygemm first on its path (the one under test)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(cygemm.__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))


def gpu_reason():
    reason = cygemm.gpu_unavailable_reason()
    assert reason and ("no NVIDIA GPU" in reason or "driver" in reason)
    return reason
