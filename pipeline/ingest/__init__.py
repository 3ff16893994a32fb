"""Raw data in: stage ``download`` (web images with img2dataset, real world only) and stage
``ingest`` (``ingest``: raw annotations -> manifest + rejects), with one reader per source format
(``sources/``) and the manifest schemas (``manifest``). The reasons a row is rejected or removed are
``pipeline.common.reasons``.
Image decoding, which extraction and decontamination share, is ``pipeline.common.image_io``."""
