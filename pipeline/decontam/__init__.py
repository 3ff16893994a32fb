"""Stage ``decontaminate``: no downstream evaluation image reaches pretraining.

``decontaminate`` is the stage; ``eval_set`` collects the evaluation images and their identity keys,
``urls``/``url_vec`` canonical URLs and Flickr ids (scalar and vectorized), ``phash`` perceptual
near-duplicates, ``arrow_sort`` the fast id sort of the clean manifests, and ``cleaning_report`` the
cleaning reports (JSON, Markdown, HTML) that ``python -m pipeline report cleaning`` reads.
"""
