"""Reading UNITER's released LMDBs (formats, layout) and converting them (images, texts); the stage is
``pipeline.stores.import_uniter_db``."""
