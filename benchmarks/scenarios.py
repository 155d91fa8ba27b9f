"""One branch of the seed's decision tree, tested in a toy built for it (issues 55 and 56).

    python benchmarks/scenarios.py tool_calls             # the full scenario: writes benchmarks/results/scenario_tool_calls.json
    python benchmarks/scenarios.py tool_calls --quick --out /tmp/x.json   # 1 sweep seed, 2 seeds, 2 steps: a look at the code path

Each scenario (:data:`grpo_lab.lab.scenarios.SCENARIOS`) first sweeps every arm's learning rate on seeds kept apart
from the comparison's (100-102), keeps each arm's best rate on the primary endpoint fixed before the runs (the mean
greedy test accuracy over the evaluations after step 0), then trains every arm at its rate on seeds 0-4 and judges
each mechanism by the book's regime rules (:data:`grpo_lab.lab.regime.RULES`, committed before the runs: the results
record that commit) and by paired, Bonferroni-corrected differences. Two runs at a time on two cores.

``tool_calls`` (issue 56, the seed's branch "multi-turn tool calls -> DAPO + token-level loss"): ``calculator-base``
on :class:`grpo_lab.tasks.CalculatorTask` (``a*b+c=`` with a ``calc(...)`` tool whose answer joins the context as
observation tokens), 16 prompts x 8 episodes per step, 20 steps, evaluation every 5; arms GRPO, DAPO, DAPO with
GRPO's sample-level loss (the ablation of the token-level loss), GSPO and CISPO.

``long_cot_moe`` (issue 55, the seed's branch "long-CoT on a Mixture-of-Experts -> GSPO + Dr.GRPO ideas"):
``arithmetic-moe-base`` (until a long chain-of-thought MoE twin replaces it) on the arithmetic task, 4 minibatches
per rollout (GSPO §5.1), rates 3e-5, 1e-4, 3e-4; arms GRPO, GRPO with Routing Replay (``routing_replay=True``, a
trainer setting the arm carries), GSPO and GSPO with Dr.GRPO's group-mean advantage. Its routing rule is measured,
not assumed: ``benchmarks/moe_sampler_routing.py`` found no sampler precision that reaches GSPO's 10%.
``long_cot_dense`` (issue 55, "long-CoT on a dense model -> DAPO / VAPO"): ``long-chain-base`` on
:class:`grpo_lab.tasks.LongChainTask` (sums of 3-14 one-digit terms reduced one addition per step, up to 199 tokens,
a 180-token budget), 8 prompts x 8 per step, 12 steps, evaluation every 4, rates 3e-5, 1e-4, 3e-4 on sweep seeds
100-101; arms GRPO, Dr.GRPO, DAPO, VAPO, CISPO and GSPO (about 20 min). ``long_cot_stability`` (issue 55, "extreme
stability requirements -> CISPO"): the same base at 16 minibatches per rollout (MiniMax-M1 §3.1's 16 off-policy
updates), 16 prompts x 8; arms GRPO, DAPO and CISPO (about 17 min).
``dialogue`` (issue 55, the seed's branch "general dialogue alignment -> GRPO / PPO"): ``corpus-base`` on
:class:`grpo_lab.tasks.DialogueTask` (open-ended 32-token continuations trained on a learned proxy reward model and
judged by a known gold reward: the endpoint is the greedy gold mean on 64 held-out contexts), 16 prompts x 8 per
step, 16 steps, evaluation every 4; arms GRPO, PPO and Dr.GRPO.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo_lab.lab import scenarios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=sorted(scenarios.SCENARIOS))
    ap.add_argument("--quick", action="store_true", help="1 sweep seed, 2 comparison seeds, 2 steps (a code-path check)")
    ap.add_argument("--out", type=Path, default=None, help="the results file (default: benchmarks/results/scenario_NAME.json)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--no-cache", action="store_true", help="do not read or write the run cache")
    a = ap.parse_args(argv)
    if a.quick and a.out is None:
        sys.exit("benchmarks/scenarios.py: --quick needs --out (a quick look never replaces the committed results)")
    sc = scenarios.SCENARIOS[a.name]
    kw = dict(steps=2, sweep_seeds=[100], seeds=[0, 1]) if a.quick else {}
    res = scenarios.run_scenario(sc, n_jobs=a.jobs, cache=not a.no_cache, **kw)
    out = a.out or scenarios.results_path(a.name)
    out.write_text(json.dumps(res, indent=1) + "\n")
    if a.quick:
        print(f"QUICK LOOK ({res['quick']}): a check of the code path; its numbers and verdict words are not the "
              "scenario's results")
    print(scenarios.scenario_table(res).to_string())
    print(scenarios.verdict_table(res)[["verdict", "reason"]].to_string())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
