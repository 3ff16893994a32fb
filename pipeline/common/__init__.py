"""What every stage shares and no stage owns: run records and atomic file writes (``runinfo``),
ownership markers on the directories stages may clear and the atomic directory swap (``ownership``),
one writer per output (``locking``), progress reporting (``progress``), robust image decoding
(``image_io``), the reasons a row leaves the pipeline (``reasons``), what a source reader yields and
the source format errors (``source_records``), pickles that may hold only plain data
(``plain_pickle``), where train_detector leaves the detector (``detector_files``: extract and the
results stage read it), machine capabilities (``hardware``) and GPU allotment for concurrent Airflow
tasks (``gpu_alloc``)."""
