"""Region features: stage ``train_detector`` (``train_detector``: the mini world's C4 detector) and
stage ``extract`` (``extract``: Faster R-CNN region features, sharded; ``image_sets``: one source's
images and outputs; ``parts``: one source split over K tasks and the merge), on the detectron2
models of ``detector/``."""
