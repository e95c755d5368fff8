"""Engines: what training, the callbacks and the commands all use, below all of them.

``readout`` (the shared head at layer l), ``early_exit`` (block by block with the shared head), ``coupling`` (block
Jacobians over prompts) and ``compare`` (two models' features over a stream of batches). ``lightning_modules``,
``callbacks`` and ``commands`` import from here; an engine imports only layer access, metrics and the
results format.
"""
