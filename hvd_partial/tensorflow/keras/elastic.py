"""``hvd_partial.tensorflow.keras.elastic``: the path of Horovod's
``horovod.tensorflow.keras.elastic``; the same module as
:mod:`hvd_partial.keras.elastic`.

Example::

    import hvd_partial.tensorflow.keras as hvd

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
"""

from ...keras.elastic import *  # noqa: F401,F403
from ...keras.elastic import __all__  # noqa: F401
