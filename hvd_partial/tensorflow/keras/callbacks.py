"""``hvd_partial.tensorflow.keras.callbacks``: the callbacks of
:mod:`hvd_partial.keras.callbacks` under Horovod's module path.

Example::

    from hvd_partial.tensorflow.keras import callbacks
    callbacks.BroadcastGlobalVariablesCallback(0)
"""

from ...keras.callbacks import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,  # noqa: F401
                                FlushCallback, LearningRateScheduleCallback,
                                LearningRateWarmupCallback, MetricAverageCallback, ParticipationReportCallback)
