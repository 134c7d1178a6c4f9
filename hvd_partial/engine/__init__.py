"""The background engine thread (:mod:`.engine`) and its handles (:mod:`.handle`).

Import them from their modules: this package imports nothing itself, so that
the helper collectives, which the engine imports, can import its handles
without an import cycle.
"""
