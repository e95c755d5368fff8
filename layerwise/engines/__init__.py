"""Engines: what both training and the commands use, below both (early exit: block by block with the shared head).

``lightning_modules`` (``predict_step``), ``callbacks`` (``EarlyExitPredictionWriter``) and ``inference`` (the
commands) import from here; an engine imports only layer access, metrics and the results format.
"""
