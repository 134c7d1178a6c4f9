"""``hvd_partial.tensorflow.keras``: the path of Horovod's
``horovod.tensorflow.keras``, so that a script changes only its import. The
same module as :mod:`hvd_partial.keras` (Keras 3 on TensorFlow).

Example::

    import hvd_partial.tensorflow.keras as hvd      # was: import horovod.tensorflow.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3))
"""

from ...keras import *  # noqa: F401,F403
from ...keras import __all__, callbacks, elastic  # noqa: F401
