"""What a command-line run reports (issue 36 item 4, :mod:`grpo_lab.cli.report`): a line per step and seed
read from each seed's ``metrics.jsonl`` while the run trains, the labelled summary (mean ± sd over seeds,
95% t interval, per seed, binomial error), each seed's saved model and the figure of the curves.

The command-line tests run :func:`grpo_lab.cli.main.main` in-process with ``experiments.run`` replaced by a fake
that writes what a real run writes into each seed's directory (its step log line by line, its ``final/``
model), so they take a second; ``tests/cli/test_cli.py`` runs the real thing end to end (one seed, and two
seeds in two worker processes)."""

import dataclasses
import json
import math
import os
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from scipy import stats as scipy_stats

from grpo_lab.cli import main as cli
from grpo_lab import experiments
from grpo_lab.cli.report import StepPrinter, count_test_problems, figure_path, save_curves, step_line, summary_lines
from grpo_lab.experiments import RunResult, load_results
from grpo_lab.experiments.run_dirs import _finish_seed, final_model_dir, save_final_model, seed_dir
from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, load_policy, tiny_policy

ROW = {"step": 3, "reward": 0.5234, "accuracy": 0.5, "kl": 0.00309, "clip_frac": 0.0136, "length": 8.34,
       "step_seconds": 1.28, "test_accuracy": float("nan")}


# ------------------------------------------------------------------------------------ step lines
def test_step_line_shows_the_key_metrics_and_leaves_out_what_was_not_measured():
    line = step_line(ROW, label="GRPO seed 1", steps=40)
    assert line == ("GRPO seed 1 step  3/40 | reward 0.523 | accuracy 0.500 | kl 0.0031 | clip_frac 0.014 | "
                    "length 8.3 | 1.3 s")
    evaluated = step_line({**ROW, "kl": float("nan"), "test_accuracy": 0.40909, "eval_seconds": 0.21},
                          label="DAPO seed 0", steps=3)
    assert "kl" not in evaluated and evaluated.endswith("| 1.3 s | test_accuracy 0.409 (eval 0.2 s)")
    base = step_line({"step": 0, "test_accuracy": 0.404, "eval_seconds": 0.2}, label="GRPO seed 0", steps=2)
    assert base == "GRPO seed 0 step 0/2 | base policy | test_accuracy 0.404 (eval 0.2 s)"


def _append(path, *rows, end="\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows[:-1]) + json.dumps(rows[-1]) + end)


def test_step_printer_prints_each_step_once_complete_lines_only_and_follows_a_rewritten_file(tmp_path):
    lines = []
    printer = StepPrinter({0: tmp_path / "s0", 1: tmp_path / "s1"}, name="GRPO", steps=3, emit=lines.append)
    assert printer.poll() == 0  # no file yet
    _append(tmp_path / "s0" / "metrics.jsonl", {"step": 0, "test_accuracy": 0.25}, {"step": 1, "reward": 0.5})
    _append(tmp_path / "s1" / "metrics.jsonl", {"step": 1, "reward": 0.75}, end="")  # a line still being written
    assert printer.poll() == 2
    assert lines == ["GRPO seed 0 step 0/3 | base policy | test_accuracy 0.250", "GRPO seed 0 step 1/3 | reward 0.500"]
    with open(tmp_path / "s1" / "metrics.jsonl", "a") as f:
        f.write("\n")
    assert printer.poll() == 1 and lines[-1] == "GRPO seed 1 step 1/3 | reward 0.750"
    # a resumed run rewrites the file (a new one renamed over it): steps printed already are not printed again
    new = tmp_path / "s0" / "new.jsonl"
    _append(new, {"step": 0, "test_accuracy": 0.25}, {"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.625})
    os.replace(new, tmp_path / "s0" / "metrics.jsonl")
    assert printer.poll() == 1 and lines[-1] == "GRPO seed 0 step 2/3 | reward 0.625"
    assert printer.printed == {0: 3, 1: 1}


def test_step_printer_thread_prints_while_the_block_runs_and_the_rest_at_its_end(tmp_path):
    lines = []
    log = tmp_path / "s0" / "metrics.jsonl"
    with StepPrinter({0: tmp_path / "s0"}, name="GRPO", steps=2, emit=lines.append, interval=0.01,
                     after={0: 0}) as printer:
        _append(log, {"step": 0, "test_accuracy": 0.25}, {"step": 1, "reward": 0.5})
        deadline = time.monotonic() + 5
        while not lines and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lines == ["GRPO seed 0 step 1/2 | reward 0.500"]  # step 0 is before the resume point: not new
        _append(log, {"step": 2, "reward": 0.25})
    assert lines[-1] == "GRPO seed 0 step 2/2 | reward 0.250" and printer.printed == {0: 2}
    with pytest.raises(KeyboardInterrupt), StepPrinter({0: tmp_path / "s0"}, name="GRPO", steps=3,
                                                       emit=lines.append, interval=60, after={0: 2}):
        _append(log, {"step": 3, "reward": 0.75})  # logged, then Ctrl-C (or SIGTERM) before the next read
        raise KeyboardInterrupt
    assert lines[-1] == "GRPO seed 0 step 3/3 | reward 0.750"  # D13: the last printed step is the last logged
    with pytest.raises(ValueError, match="interval must be > 0"):
        StepPrinter({}, name="GRPO", steps=1, interval=0)


# ------------------------------------------------------------------------------------ summary
def _result(finals, base=0.25, steps=2):
    rows = []
    for seed, final in finals.items():
        rows.append({"algo": "GRPO", "seed": seed, "step": 0, "test_accuracy": base})
        rows += [{"algo": "GRPO", "seed": seed, "step": k, "reward": 0.5 + 0.1 * k + 0.01 * seed, "kl": 0.001 * k,
                  "test_accuracy": final if k == steps else float("nan")} for k in range(1, steps + 1)]
    prov = {"steps": steps, "seeds": list(finals), "wall_seconds": 1.5, "cached_seeds": []}
    return RunResult(pd.DataFrame(rows), prov)


def test_summary_labels_mean_sd_interval_per_seed_and_binomial_error():
    finals = {0: 0.5, 1: 0.52, 2: 0.54}
    lines = summary_lines(_result(finals), name="GRPO", profile="cpu", n_test=50)
    # by hand: mean 0.52, sd 0.02, half-width t_{0.975, 2} * 0.02 / sqrt(3) (scipy's quantile 4.303)
    half = scipy_stats.t.ppf(0.975, 2) * 0.02 / math.sqrt(3)
    assert lines[0] == "GRPO [cpu] 2 steps x 3 seed(s), 1.5 s"
    assert lines[1] == (f"test accuracy (greedy, 50 problems): base 0.250 -> final 0.520 ± 0.020 (mean ± sd over 3 "
                        f"seeds), 95% interval [{0.52 - half:.3f}, {0.52 + half:.3f}] (Student t over seeds)")
    assert lines[2] == "  per seed: s0 0.500 (25/50), s1 0.520 (26/50), s2 0.540 (27/50)"
    se = math.sqrt(0.52 * 0.48 / 50)
    assert lines[3].endswith(f"at 0.520 on 50 problems: {se:.3f} (the test set's own sampling error)")
    assert lines[4].startswith("last step (mean over seeds): reward 0.710, kl 0.0020")


def test_summary_of_one_seed_has_no_spread_and_equal_seeds_say_so():
    one = summary_lines(_result({7: 0.5}), name="GRPO", profile="cpu", n_test=None)
    assert "final 0.500 (1 seed: no spread over seeds, no interval)" in one[1] and "±" not in one[1]
    assert one[2] == "  per seed: s7 0.500" and not any("binomial" in line for line in one)
    same = summary_lines(_result({0: 0.5, 1: 0.5, 2: 0.5}), name="GRPO", profile="cpu", n_test=10)
    assert "final 0.500 ± 0.000" in same[1] and "every seed ended at the same accuracy" in same[2]
    res = _result({0: 0.5})
    res.history["test_accuracy"] = float("nan")
    assert summary_lines(res, name="GRPO", profile="cpu")[1] == "test accuracy: not measured (eval_every=0)"


def test_count_test_problems():
    assert count_test_problems("arithmetic", (("digits", 1), ("test_size", 6))) == 6  # generated: 2 per term count
    assert count_test_problems("arithmetic") == 198  # the shipped test set
    assert count_test_problems("no such task") is None


# ------------------------------------------------------------------------------------ figure, model
def test_save_curves_writes_a_png_and_refuses_an_empty_history(tmp_path):
    path = save_curves(_result({0: 0.5, 1: 0.6}).history, tmp_path / "r.png", title="GRPO")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert figure_path("runs/grpo.json") == figure_path("runs/grpo") == Path("runs/grpo.png")
    with pytest.raises(ValueError, match="no test_accuracy or reward"):
        save_curves(pd.DataFrame({"step": [0], "seed": [0], "loss": [1.0]}), tmp_path / "x.png")


def _tiny():
    tok = build_char_tokenizer()
    cfg = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1)
    return tiny_policy(tok, cfg, seed=0), tok


class _Holder:
    """What save_final_model reads of a trainer."""

    def __init__(self, policy, tokenizer):
        self.policy, self.tokenizer = policy, tokenizer

    def _show_progress(self):
        return False


def _logits(model, tok):
    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_save_final_model_loads_with_load_policy(tmp_path):
    policy, tok = _tiny()
    path, kind = save_final_model(_Holder(policy, tok), tmp_path / "seed-0")
    assert path == final_model_dir(tmp_path / "seed-0") == tmp_path / "seed-0" / "final" and kind == "full weights"
    loaded, loaded_tok = load_policy(path, progress=False)
    assert torch.equal(_logits(loaded, loaded_tok), _logits(policy, tok))


@pytest.mark.slow  # importing peft alone takes ~10 s on two busy cores
def test_save_final_model_merges_lora_adapters(tmp_path):
    pytest.importorskip("peft")
    from grpo_lab.policy.lora import LoraSpec

    policy, tok = _tiny()
    plain = _logits(policy, tok)
    lora = LoraSpec(r=2, alpha=4, target_modules=("q_proj", "v_proj")).apply(policy, seed=0)
    with torch.no_grad():  # adapters that change the function (lora_B starts at 0)
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in lora.state_dict().items()}
    path, kind = save_final_model(_Holder(lora, tok), tmp_path / "seed-1")
    assert kind == "LoRA adapters merged into the base weights" and not (path / "adapter_config.json").exists()
    assert all(torch.equal(v, lora.state_dict()[k]) for k, v in before.items())  # the trained policy untouched
    merged, _ = load_policy(path, progress=False)
    assert torch.allclose(_logits(merged, tok), _logits(lora, tok), atol=1e-5)
    assert not torch.allclose(_logits(merged, tok), plain, atol=1e-3)  # the adapters are in it
    from peft import PeftModel  # the adapters alone, as peft writes them, on a fresh copy of the base

    base, _ = _tiny()
    again = PeftModel.from_pretrained(base, path / "adapter")
    assert torch.allclose(_logits(again, tok), _logits(lora, tok), atol=1e-6)


def test_run_save_model_needs_an_output_dir():
    with pytest.raises(ValueError, match="save_model=True writes each seed's model under output_dir"):
        experiments.run("GRPO", seeds=[0], steps=1, save_model=True)


# ------------------------------------------------------------------------------------ the command line
@pytest.fixture
def writing_run(monkeypatch):
    """``experiments.run`` replaced by a fake that writes each seed's step log line by line (as the jsonl
    tracker does) and, with ``save_model``, a loadable ``final/`` model; seed ``s`` ends at ``0.5 + s/100``."""
    calls = []
    policy, tok = _tiny()

    def fake(algo, **kwargs):
        calls.append(kwargs)
        seeds, steps, rows = list(kwargs["seeds"]), kwargs["steps"], []
        for s in seeds:
            directory = seed_dir(kwargs["output_dir"], algo.name, s)
            for k in range(steps + 1):
                row = {"step": k, "test_accuracy": 0.25} if k == 0 else {"step": k, "reward": 0.5, "kl": 0.01,
                                                                         "clip_frac": 0.0, "length": 6.0}
                if k == steps:
                    row["test_accuracy"] = 0.5 + s / 100
                _append(directory / "metrics.jsonl", row)
                rows.append({"algo": algo.name, "seed": s, **row})
            if kwargs.get("save_model"):
                save_final_model(_Holder(policy, tok), directory)
            _finish_seed(directory, steps, [r for r in rows if r["seed"] == s])
            (directory / "run.json").write_text(json.dumps({"algo": {"name": algo.name}, "config": {"seed": s}}))
        prov = {"steps": steps, "seeds": seeds, "wall_seconds": 0.1, "cached_seeds": [],
                "algo": dataclasses.asdict(algo)}
        return RunResult(pd.DataFrame(rows), prov)

    monkeypatch.setattr(experiments, "run", fake)
    return calls


def test_cli_prints_step_lines_a_summary_matching_the_results_model_and_figure_paths(writing_run, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["GRPO", "--steps", "2", "--seeds", "0", "1", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out.splitlines()
    steps = [line for line in stdout if line.startswith("GRPO seed ")]
    assert [line.split(" |")[0] for line in steps] == [f"GRPO seed {s} step {k}/2" for s in (0, 1) for k in (0, 1, 2)]
    assert stdout.index(steps[-1]) < stdout.index("GRPO [cpu] 2 steps x 2 seed(s), 0.1 s")  # lines, then summary
    final = load_results(out).final()  # the summary's numbers are the results file's
    summary = next(line for line in stdout if line.startswith("test accuracy (greedy, 198 problems)"))
    assert f"final {final.mean():.3f} ± {final.std():.3f} (mean ± sd over 2 seeds)" in summary
    assert f"  per seed: s0 {final[0]:.3f} (99/198), s1 {final[1]:.3f}" in stdout
    run_dir = tmp_path / "r"
    for s in (0, 1):
        path = run_dir / "GRPO" / f"seed-{s}" / "final"
        assert f"  seed {s}: {path}" in stdout
        load_policy(path, progress=False)
    assert f"figure: {tmp_path / 'r.png'}" in stdout[-3] and (tmp_path / "r.png").stat().st_size > 0
    assert stdout[-2:] == [f"results: {out}", f"configuration: {run_dir / 'config.yaml'}"]


def test_cli_quiet_no_save_model_and_trackers_without_jsonl(writing_run, tmp_path, capsys):
    assert cli.main(["GRPO", "--steps", "1", "--seeds", "0", "--quiet", "--no-save-model",
                     "--out", str(tmp_path / "q.json")]) == 0
    stdout = capsys.readouterr().out
    assert "GRPO seed " not in stdout and "final models" not in stdout and "results: " in stdout
    assert writing_run[-1]["save_model"] is False and writing_run[-1]["progress"] is None  # the bar, in a terminal
    assert not (tmp_path / "q" / "GRPO" / "seed-0" / "final").exists()
    assert cli.main(["GRPO", "--steps", "1", "--seeds", "0", "--report-to", "tensorboard",
                     "--out", str(tmp_path / "t.json")]) == 0
    stdout = capsys.readouterr().out
    assert stdout.startswith("(no per-step lines: they are read from each seed's metrics.jsonl, which --report-to")


def test_cli_resume_of_a_finished_run_says_it_is_read_back_and_prints_no_step(writing_run, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["GRPO", "--steps", "1", "--seeds", "0", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["GRPO", "--steps", "1", "--seeds", "0", "--out", str(out), "--resume"]) == 0
    stdout = capsys.readouterr().out
    directory = tmp_path / "r" / "GRPO" / "seed-0"
    # "seed 0: finished earlier, read back from ..." is printed by run() itself once it has checked the directory
    # (here a fake): tests/experiments/test_cluster.py checks it with the real run
    assert "GRPO seed 0 step" not in stdout and f"  seed 0: {directory / 'final'}" in stdout


def test_saving_the_models_changes_no_number(tmp_path):
    from grpo_lab.experiments import Profile, run
    from grpo_lab.training.trainer import MEASURED_COLUMNS, TrainerConfig

    policy, tok = _tiny()
    policy.save_pretrained(tmp_path / "base", safe_serialization=True)
    tok.save_pretrained(tmp_path / "base")
    profile = Profile(name="t", base=str(tmp_path / "base"), task="arithmetic", steps=2,
                      config=TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=0))
    histories = []
    for save in (False, True):  # two seeds in this process: the second trains after the first one's save
        res = run("GRPO", profile=profile, seeds=[0, 1], cache=False, progress=False, save_model=save,
                  output_dir=str(tmp_path / f"out-{save}"))
        histories.append(res.history.drop(columns=[c for c in MEASURED_COLUMNS if c in res.history.columns]))
    pd.testing.assert_frame_equal(histories[0], histories[1], check_exact=True)
    assert (tmp_path / "out-True" / "GRPO" / "seed-1" / "final" / "model.safetensors").is_file()
    assert not (tmp_path / "out-False" / "GRPO" / "seed-1" / "final").exists()


def test_step_line_shows_the_multi_turn_columns_of_a_tool_task():
    # issue 56: a multi-turn task's history has turns_mean, tool_calls_mean, observation_token_frac
    row = {**ROW, "turns_mean": 1.6447, "tool_calls_mean": 0.6513, "observation_token_frac": 0.22797}
    assert step_line(row, label="DAPO seed 0", steps=2) == (
        "DAPO seed 0 step 3/2 | reward 0.523 | accuracy 0.500 | kl 0.0031 | clip_frac 0.014 | length 8.3 | "
        "turns_mean 1.64 | tool_calls_mean 0.65 | observation_token_frac 0.228 | 1.3 s")
    assert "turns_mean" not in step_line(ROW, label="GRPO seed 0")  # a single-turn row has none
