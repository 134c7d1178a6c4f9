"""Rank 2 raises in the middle of model.fit (solo mode): the other ranks,
blocked in the compiled train step or already in the epoch flush, must fail
with an error naming rank 2 instead of hanging."""

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras

import hvd_partial.keras as hvd
from support import phase, report

FAILING = 2


class Boom(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 3:
            raise RuntimeError("injected failure in a callback")


def main():
    hvd.init()
    rank = hvd.rank()
    x, y = C.classification_data(hvd.size() * 64)
    model = C.mlp(seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), mode=hvd.Solo()), loss=C.LOSS)
    callbacks = [Boom()] if rank == FAILING else []
    phase("fit")
    if rank == FAILING:
        model.fit(x[rank::3], y[rank::3], batch_size=8, epochs=1, verbose=0, callbacks=callbacks)  # dies
    try:
        model.fit(x[rank::3], y[rank::3], batch_size=8, epochs=20, verbose=0)
        report({"error": None})
    except Exception as err:  # noqa: BLE001 - the test looks at what was raised
        report({"error": type(err).__name__, "is_hvd": isinstance(err, hvd.HvdPartialError),
                "message": str(err)[-1500:]})


main()
