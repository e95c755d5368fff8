"""Engines: what training, the callbacks and the commands all use, below all of them.

``readout`` (the shared head at layer l), ``early_exit`` (block by block with the shared head), ``coupling`` (block
Jacobians over prompts), ``compare`` (two models' features over a stream of batches) and ``sampling`` (which of a
rank's evaluation samples are real, not the distributed sampler's padding). ``lightning_modules``, ``callbacks`` and
``commands`` import from here; an engine imports only layer access, metrics and the results format.
"""
