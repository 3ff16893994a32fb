"""Raw data in: stage ``download`` (web images with img2dataset, real world only) and stage
``ingest`` (``ingest``: raw annotations -> manifest + rejects), with one reader per source format
(``sources/``), the manifest schemas (``manifest``) and the reasons a row is rejected (``reasons``).
Image decoding, which extraction and decontamination share, is ``pipeline.common.image_io``."""
