"""C4 Faster R-CNN region extraction with detectron2 (docs/design.md §8).

- :mod:`presets`: detectron2 configs of ``butd_r101`` (bottom-up-attention) and ``mini``.
- :mod:`modeling`: caffe-style stem, configurable res5 head, the region API of the ROI heads.
- :mod:`roi_align`: ROIAlign as two matrix products, the mini detector's in training.
- :mod:`attributes`: the box predictor with the bottom-up-attention attribute head.
- :mod:`checkpoint`: the caffe-converted checkpoint layout (strict loading, restricted unpickling).
- :mod:`build`: a ready :class:`~pipeline.extract.detector.build.Detector` from a preset and weights.
- :mod:`selection`: the max-confidence keep rule (conf >= 0.2, 10..100 boxes).
- :mod:`extractor`: batched inference, detected and given-box modes.
- :mod:`shards`: deterministic safetensors feature shards (docs/design.md §8).
- :mod:`runner`: sharded, resumable extraction over CPU processes or GPUs.

Submodules import detectron2 and torch; import them where needed, not from here.

How torch's OpenMP threads wait is set by the stage entry (:mod:`pipeline.common.openmp`).
"""
