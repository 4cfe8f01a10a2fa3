"""Neural-network training on cygemm: dense layers, losses, optimizers and a training step
captured whole into one CUDA graph.

    model = cygemm.nn.MLP([64, 128, 128, 10], act="relu", seed=0)
    step = cygemm.nn.compile_step(model, cygemm.nn.SoftmaxCrossEntropy(),
                                  cygemm.nn.Adam(model, lr=1e-3), batch=64)
    loss = step(x_batch, y_batch)        # a 0-d device array; no synchronisation
    cygemm.nn.save("run.npz", model, step.optimizer)   # and cygemm.nn.load(...) into them

``precision="bf16-mixed"`` trains with bfloat16 GEMMs on float32 master parameters;
``"fp8-tensor"``, ``"fp8-rowwise"`` and ``"fp8-block"`` with FP8 GEMMs on them.
"""
from cygemm.nn.layers import Dense
from cygemm.nn.mlp import MLP
from cygemm.nn.losses import MeanSquaredError, SoftmaxCrossEntropy
from cygemm.nn.optimizers import SGD, Adam, AdamW
from cygemm.nn.serialization import load, save
from cygemm.nn.step import TrainStep, compile_step

__all__ = ["Dense", "MLP", "SoftmaxCrossEntropy", "MeanSquaredError", "SGD", "Adam", "AdamW",
           "compile_step", "TrainStep", "save", "load"]
