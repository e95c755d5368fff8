"""The keys of the dicts a module hands on besides the evaluation's ``LayerOutputs``.

The evaluation steps return one typed :class:`~layerwise.engines.readout.LayerOutputs` (features, the readout at every
layer, targets), built by the one readout of :mod:`layerwise.engines.readout`. Two dicts remain:

- a training strategy's :meth:`~layerwise.lightning_modules.LayerwiseModule.samples`, which its ``compute_loss`` reads:
  ``features`` ``(L, N, d)`` and ``targets`` ``(N,)``;
- detection (DetrLayerwise -> DetectionLayerAP): every decoder layer's class logits ``(L, B, Q, C+1)`` and normalised
  boxes ``(L, B, Q, 4)``, with the batch's DETR ``labels`` (a list of dicts).
"""

FEATURES = "features"
TARGETS = "targets"
LAYER_LOGITS = "layer_logits"
LAYER_BOXES = "layer_boxes"
DETECTION_LABELS = "labels"
