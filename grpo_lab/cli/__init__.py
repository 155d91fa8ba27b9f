"""The command line, ``python -m grpo_lab`` (or ``grpo-lab``): :mod:`~grpo_lab.cli.main` (the parser,
the verbs ``train``, ``list``, ``export``, ``check-config``) and :mod:`~grpo_lab.cli.report` (what a
run prints). ``python -m grpo_lab --help`` lists the options.
"""
