"""Stage ``decontaminate``: no downstream evaluation image reaches pretraining.

``decontaminate`` is the stage; ``eval_set`` collects the evaluation images and their identity keys (``coco_test_images``
reads COCO's test image list),
``matching`` finds the pretraining images that are eval images (by key, or near-duplicate by
``phash``), ``urls``/``url_vec`` canonical URLs and Flickr ids (scalar and vectorized),
``arrow_sort`` the fast id sort of the clean manifests, and ``cleaning_report`` the cleaning reports
(JSON, Markdown, HTML) that ``python -m pipeline report cleaning`` reads.
"""
