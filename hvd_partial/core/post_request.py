"""A post as it travels from the public API to the protocol driver.

``hvd_partial.api`` checks the caller's arrays and options, packs the arrays
and builds one :class:`PostRequest`; the engine hands that same object to
:meth:`~hvd_partial.core.driver.Driver.post` on its thread. Nothing on the way
copies or reshapes it.

Example::

    request = PostRequest("g", buffers, owned, layout, grouped=False, sync=False, op=Sum, signature=signature)
    driver.post(request, Waiter("post"))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..modes import ReduceOp
from .fusion import Layout
from .messages import StreamSignature


@dataclass(frozen=True, init=False)
class PostRequest:
    """One rank's post to stream ``name``.

    - ``buffers``: the packed, flat buffers of the posted arrays (:meth:`Layout.pack`).
    - ``owned``: for each buffer, whether it is a copy the stream may keep (else a view of the caller's array).
    - ``layout``: how the caller's arrays map onto ``buffers``.
    - ``grouped``: the arrays were posted together as one grouped post.
    - ``sync``: the stream's mode is sync (every round waits for every rank).
    - ``op``: the reduction (Average or Sum).
    - ``signature``: what every rank must agree on for the stream (checked at registration).
    """

    name: str
    buffers: list[np.ndarray]
    owned: list[bool]
    layout: Layout
    grouped: bool
    sync: bool
    op: ReduceOp
    signature: StreamSignature

    def __init__(self, name: str, buffers: list[np.ndarray], owned: list[bool], layout: Layout, grouped: bool,
                 sync: bool, op: ReduceOp, signature: StreamSignature):
        # One write for all fields: the generated __init__ of a frozen dataclass sets each
        # through object.__setattr__, several times slower, and every post makes one.
        self.__dict__.update(name=name, buffers=buffers, owned=owned, layout=layout, grouped=grouped, sync=sync,
                             op=op, signature=signature)
