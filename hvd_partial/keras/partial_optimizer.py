"""``PartialDistributedOptimizer``: Horovod's Keras optimizer for model
parallelism. The gradients of the ``local_layers``' trainable weights are this
rank's own: never reduced, divided by the number of ranks (of the
``process_set``) with ``scale_local_gradients=True`` (the default, as in
Horovod); every other gradient is reduced as a ``DistributedOptimizer``
reduces it. Local weights may differ between ranks, in value and shape.

Sync mode only (``mode`` left out means ``Sync()``): a solo or majority round
can apply gradients posted at other steps, to which this rank's local
gradients do not belong, so ``mode=Solo()`` or ``Majority(...)`` raises
``NotSupportedError``; so does ``backward_passes_per_step > 1``.

Example::

    import hvd_partial.keras as hvd

    opt = hvd.PartialDistributedOptimizer(keras.optimizers.Adam(1e-3), local_layers=[model.layers[0]])
    model.compile(optimizer=opt, loss="mse")
"""

from __future__ import annotations

import keras
import tensorflow as tf

from ..errors import NotSupportedError
from ..modes import Sync
from ..tensorflow.exchange import graph_builder
from ..tensorflow.gradient_tape import local_layer_weights, scaled_local
from .optimizer import DistributedOptimizer


class PartialDistributedOptimizer(DistributedOptimizer):
    """A :class:`~hvd_partial.keras.DistributedOptimizer` whose ``local_layers``'
    gradients are not reduced (see the module docstring). Arguments are
    ``DistributedOptimizer``'s plus Horovod's ``local_layers`` (a layer or a
    list of layers; their weights are read at every update, so the layers may
    be built later) and ``scale_local_gradients``. ``get_config`` does not
    hold the local layers: a model saved with this optimizer loads (with
    ``custom_objects`` naming the class) without them; make the optimizer
    again with ``local_layers`` to go on training.

    Example::

        opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=model.layers[:1])
    """

    def __init__(self, optimizer, name: str | None = None, local_layers=None, scale_local_gradients: bool = True,
                 *, mode=None, backward_passes_per_step: int = 1, **kwargs):
        if mode is not None and getattr(mode, "kind", None) != "sync":
            raise NotSupportedError(
                f"PartialDistributedOptimizer(mode={mode}): local layers need sync mode (a solo or majority round "
                "can apply other steps' gradients, to which this rank's local gradients do not belong); leave mode "
                "out or pass hvd.Sync()")
        if backward_passes_per_step != 1:
            raise NotSupportedError(
                f"PartialDistributedOptimizer(backward_passes_per_step={backward_passes_per_step}): local layers "
                "with gradient accumulation are not supported; use backward_passes_per_step=1")
        super().__init__(optimizer, name=name, mode=Sync(), **kwargs)
        self.__dict__["local_layers"] = local_layers
        self.scale_local_gradients = bool(scale_local_gradients)
        # (local gradients, their variables) of the update being applied; None between updates.
        self.__dict__["_local_update"] = None

    def local_variables(self) -> list:
        """The trainable weights of the local layers (read now)."""
        return local_layer_weights(self.local_layers)

    @graph_builder
    def apply(self, grads, trainable_variables=None):
        """Reduce the shared gradients, apply them and the local ones in one inner update."""
        grads = list(grads)
        variables = list(self.model_variables or []) if trainable_variables is None else list(trainable_variables)
        local_ids = {id(v) for v in self.local_variables()}
        local = [i for i, v in enumerate(variables) if id(v) in local_ids]
        if not local or not grads:
            return super().apply(grads, trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
        process_set = self.exchange.process_set
        local_grads = [scaled_local(grads[i], process_set) if self.scale_local_gradients else grads[i]
                       for i in local]
        pairs = [(g, variables[i]) for g, i in zip(local_grads, local) if g is not None]
        shared = [i for i in range(len(variables)) if i not in set(local)]
        if not shared:
            if pairs:
                self.inner_optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
            return None
        self.__dict__["_local_update"] = pairs
        try:
            return super().apply([grads[i] for i in shared], [variables[i] for i in shared])
        finally:
            self.__dict__["_local_update"] = None

    def _apply_one(self, grads, variables, values):
        pairs = self.__dict__.get("_local_update") or []
        # Read inside the round's loop body (graph mode): the inner update must see tensors of its own graph.
        grads = list(grads) + [tf.nest.map_structure(tf.identity, g, expand_composites=True) for g, _ in pairs]
        variables = list(variables) + [v for _, v in pairs]
        super()._apply_one(grads, variables, values)

    def verify_across_ranks(self, variables=None) -> None:
        """As ``DistributedOptimizer``'s, leaving out the local layers' weights
        (their shapes may differ between ranks)."""
        variables = list(variables if variables is not None else (self.model_variables or []))
        local_ids = {id(v) for v in self.local_variables()}
        super().verify_across_ranks([v for v in variables if id(v) not in local_ids])

    def get_config(self):
        config = super().get_config()
        config["scale_local_gradients"] = self.scale_local_gradients
        return config
