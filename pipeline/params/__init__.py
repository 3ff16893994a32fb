"""``params.yaml`` as typed, frozen, checked dataclasses.

``parser`` reads the file (with ``--set`` overrides) strictly into
:class:`~pipeline.params.parser.Params`; one module per section (``world``, ``ingest``,
``decontaminate``, ``extract``, ``dbs``, ``model``, ``pretrain``, ``finetune``) holds its
dataclasses, defaults and ``problems()``; ``checks`` holds the range and rule helpers they share,
``inputs`` which raw inputs the configured stages read (the path checks). These modules are
import-light (no torch): the CLI parses params before it imports a stage.
"""
