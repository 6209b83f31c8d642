"""Studies: the course's claims about the transformer's parts, run as experiments with verdicts.

A study (conf/study/NAME.yaml) is a claim, a metric, and variants (overrides of
`pipelines/train.py`, or a baseline runner) run with several seeds as one Hydra multirun
(`python pipelines/study.py study=NAME`): every job one MLflow child run under the parent
`study/NAME`. `jobs.py` runs one job, `probes.py` measures what a score alone does not show
(attention at initialisation, gradient norms per layer, validation curves, expert load), and
`summary.py` turns the jobs into `studies/NAME/summary.json`, `figure.png` and a computed verdict.
"""
