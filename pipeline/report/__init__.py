"""What the runs measured, as tables and plots: stage ``results`` (``results``: the results table
with Meta-Sum), stage ``ablations`` (``ablations``: the masking ablation's table), ``plots``
(offline PNG/SVG curves), and the ``python -m pipeline report`` tool (``cli``: cleaning reports;
``results_cli``: results and experiments side by side; ``seed_spread``: spread over seeds;
``checks``: the demo's verdicts and margins; ``matrix``: those verdicts over seeds x precisions x
threads)."""
