"""Raw data in: stage ``download`` (web images with img2dataset, real world only) and stage
``ingest`` (``ingest``: raw annotations -> manifest + rejects), with one reader per source format
(``sources/``), the manifest schemas (``manifest``), the reasons a row is rejected (``reasons``) and
the robust image decoding that ingest and extraction share (``image_io``)."""
