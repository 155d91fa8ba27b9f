"""Tests for the callbacks and trackers of :mod:`grpo_lab.training.callbacks` (``TrainerConfig.report_to``,
``Trainer(callbacks=...)``, ``--report-to``): every tracker's files are read back with the tracker's own
reader (JSONL with :mod:`json`, TensorBoard's ``EventAccumulator``, wandb's offline ``.wandb`` log through
wandb's protobuf ``Record``) and compared with the trainer's history."""

import dataclasses
import glob
import json
import math
import os
import random
import warnings
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import grpo_lab.tasks as tasks_mod
from _toys import TINY, HalfTask
from grpo_lab.cli import main as cli
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import tiny_policy
from grpo_lab.training.history import evaluate_frame
from grpo_lab.training.trainer import MEASURED_COLUMNS, Trainer, TrainerConfig
from grpo_lab.training import callbacks as cb_mod
from grpo_lab.training.callbacks import SAMPLE_ROWS, TRACKERS, JsonlLogger, TrainerCallback, make_callbacks

REPO = Path(__file__).resolve().parents[2]
TEST_SIZE = 10  # more than SAMPLE_ROWS: the samples table is cut to its first rows


def make_trainer(tok, out=None, report_to=("jsonl",), callbacks=None, **kw):
    cfg = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=1, progress=False, lr=1e-2, seed=0,
               output_dir=None if out is None else str(out), report_to=report_to)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=TEST_SIZE), GRPO, TrainerConfig(**cfg),
                   callbacks=callbacks)


def same(a, b) -> bool:
    """Equal values, NaN equal to NaN, floats bit for bit."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Recorder(TrainerCallback):
    """Records every hook's arguments, and draws random numbers in each (which must not change the run)."""

    def __init__(self):
        self.calls = []
        self.rows = []

    def _draw(self):
        random.random(), np.random.rand(), torch.rand(3)

    def on_train_begin(self, trainer):
        self._draw()
        self.calls.append(("begin", trainer.step))

    def on_step(self, trainer, row):
        self._draw()
        assert row == trainer.rows[-1] and row is not trainer.rows[-1]  # a copy of the complete row
        self.calls.append(("step", row["step"]))
        self.rows.append(("step", row["step"], row))

    def on_evaluate(self, trainer, row, samples):
        self._draw()
        self.calls.append(("evaluate", row["step"], samples))

    def on_save(self, trainer, path):
        self.calls.append(("save", Path(path)))

    def on_train_end(self, trainer):
        self.calls.append(("end", trainer.step))


# ---------------------------------------------------------------------------------------------- JSONL
def test_jsonl_holds_every_step_once_bit_for_bit(tok, tmp_path):
    tr = make_trainer(tok, tmp_path, eval_every=2)
    tr.train(3)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for record, row in zip(records, tr.rows):
        assert record.keys() == row.keys()
        bad = [k for k in row if not same(record[k], row[k])]
        assert not bad, bad
    assert math.isnan(records[1]["routing_change_frac"])  # a dense policy: written as NaN, read back as NaN
    assert "test_accuracy" not in records[1]  # no evaluation at step 1
    samples = pd.read_json(tmp_path / "samples.jsonl", lines=True)
    assert list(samples.groupby("step").size().items()) == [(0, SAMPLE_ROWS), (2, SAMPLE_ROWS), (3, SAMPLE_ROWS)]
    prompts = [p.prompt for p in tr.task.test_set()[:SAMPLE_ROWS]]
    assert samples[samples.step == 3]["prompt"].tolist() == prompts
    assert {"completion", "answer", "correct", "length"} <= set(samples.columns)


def test_history_identical_with_and_without_trackers(tok, tmp_path):
    pytest.importorskip("tensorboard")
    plain = make_trainer(tok, None)
    plain.train(2)
    states = torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    tracked = make_trainer(tok, tmp_path, report_to=("jsonl", "tensorboard"), callbacks=[Recorder()])
    np.random.set_state(np.random.get_state())  # the trainer never draws from numpy's global generator
    tracked.train(2)
    assert torch.equal(torch.random.get_rng_state(), states[0]) and random.getstate() == states[1]
    pd.testing.assert_frame_equal(plain.history.drop(columns=list(MEASURED_COLUMNS)),
                                  tracked.history.drop(columns=list(MEASURED_COLUMNS)), check_exact=True)
    for a, b in zip(plain.policy.parameters(), tracked.policy.parameters()):
        assert torch.equal(a, b)
    assert plain.rng.bit_generator.state == tracked.rng.bit_generator.state


class Vandal:
    """A callback that writes into what it is given."""

    def on_step(self, trainer, row):
        row["reward"] = 999.0

    def on_evaluate(self, trainer, row, samples):
        samples["completion"] = "x"


def test_a_callback_writing_into_its_row_changes_nothing(tok):
    plain = make_trainer(tok, None)
    plain.train(2)
    rec = Recorder()
    vandalised = make_trainer(tok, None, callbacks=[Vandal(), rec])
    vandalised.train(2)
    pd.testing.assert_frame_equal(plain.history.drop(columns=list(MEASURED_COLUMNS)),
                                  vandalised.history.drop(columns=list(MEASURED_COLUMNS)), check_exact=True)
    assert 999.0 not in [c[2]["reward"] for c in rec.rows if c[0] == "step" and "reward" in c[2]]
    assert all((c[2]["completion"] != "x").all() for c in rec.calls if c[0] == "evaluate")


def test_no_output_dir_writes_nothing_but_callbacks_run(tok, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec = Recorder()
    tr = make_trainer(tok, None, report_to=("jsonl",), callbacks=[rec])
    assert tr.callbacks == [rec]
    tr.train(1)
    assert list(tmp_path.iterdir()) == []
    assert [c[:2] for c in rec.calls] == [("begin", 0), ("step", 0), ("evaluate", 0), ("step", 1), ("evaluate", 1),
                                          ("end", 1)]


def test_user_callback_gets_every_hook(tok, tmp_path):
    rec = Recorder()
    tr = make_trainer(tok, None, callbacks=[rec], eval_every=2)
    tr.train(3)
    tr.save(tmp_path / "ckpt")
    kinds = [c[0] for c in rec.calls]
    assert kinds == ["begin", "step", "evaluate", "step", "step", "evaluate", "step", "evaluate", "end", "save"]
    assert [c[1] for c in rec.calls if c[0] == "step"] == [0, 1, 2, 3]
    evals = [c for c in rec.calls if c[0] == "evaluate"]
    assert [c[1] for c in evals] == [0, 2, 3]
    for _, step, samples in evals:
        assert isinstance(samples, pd.DataFrame) and len(samples) == SAMPLE_ROWS
        assert list(samples.columns) == ["prompt", "answer", "completion", "correct", "length", "truncated"]
    # the same greedy completions as the last evaluation
    frame = evaluate_frame(tr.policy, tr.tokenizer, tr.task, tr.config, tr.amp, tr.max_new_tokens, greedy=True)[1]
    pd.testing.assert_frame_equal(evals[-1][2], cb_mod.samples_table(frame))
    assert rec.calls[-1] == ("save", tmp_path / "ckpt")
    tr.train(1)  # a second call: begin and end again, the rows continue
    assert [c[:2] for c in rec.calls[-4:]] == [("begin", 3), ("step", 4), ("evaluate", 4), ("end", 4)]


def test_on_train_end_runs_when_a_step_raises(tok, monkeypatch):
    rec = Recorder()
    tr = make_trainer(tok, None, callbacks=[rec], eval_every=0)
    monkeypatch.setattr(tr, "_train_step", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        tr.train(2)
    assert [c[0] for c in rec.calls] == ["begin", "end"]


def test_resumed_run_keeps_its_lines_and_drops_the_killed_runs_later_steps(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(tasks_mod.TASKS, "half", HalfTask)  # resume rebuilds the task from the registry
    out = tmp_path / "run"
    first = make_trainer(tok, out, eval_every=2)
    first.train(2)
    first.save(tmp_path / "ckpt")
    first.train(2)  # steps 3 and 4 are logged, then the process "dies" before another checkpoint
    before = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [0, 1, 2, 3, 4]
    resumed = Trainer.resume(tmp_path / "ckpt")
    assert resumed.config.output_dir == str(out) and isinstance(resumed.callbacks[0], JsonlLogger)
    resumed.train(2)
    after = (out / "metrics.jsonl").read_text().splitlines()
    assert after[:3] == before[:3]  # the lines up to the checkpoint are kept as written
    records = [json.loads(line) for line in after]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert all(same(r[k], row[k]) for r, row in zip(records, resumed.rows) for k in row)
    samples = pd.read_json(out / "samples.jsonl", lines=True)
    assert list(samples.groupby("step").size().index) == [0, 2, 4]  # step 4's table once, from the resumed run


def test_cut_last_line_is_dropped_and_fresh_trainer_starts_a_new_file(tok, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "reward": 1.0}\n{"step": 1, "rew')
    tr = make_trainer(tok, tmp_path, eval_every=0)
    tr.train(1)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]


# --------------------------------------------------------------------------------------- TensorBoard
def test_tensorboard_scalars_and_samples_read_back(tok, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tr = make_trainer(tok, tmp_path, report_to=("tensorboard",), eval_every=2)
    tr.train(2)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for key in ("reward", "loss", "grad_norm", "test_accuracy", "eval_seconds"):
        events = acc.Scalars(key)
        want = [(int(r["step"]), r[key]) for r in tr.rows if key in r and not math.isnan(r[key])]
        assert [(e.step, e.value) for e in events] == [(s, float(np.float32(v))) for s, v in want], key
    assert [e.step for e in acc.Scalars("test_accuracy")] == [0, 2]  # NaN (no evaluation) left out
    texts = acc.Tensors("samples/text_summary")
    assert [t.step for t in texts] == [0, 2]
    text = texts[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| prompt | answer | completion |")
    assert tr.task.test_set()[0].prompt in text and len(text.splitlines()) == 2 + SAMPLE_ROWS


def test_markdown_table_escapes_pipes_and_newlines():
    table = cb_mod.markdown_table(pd.DataFrame({"a": ["x|y"], "b": ["1\n2"]}))
    assert table.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 1<br>2 |"]


# --------------------------------------------------------------------------------------------- wandb
def read_wandb_records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then LevelDB-log
    records in 32 KiB blocks (4-byte CRC, 2-byte length, 1-byte type: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, part = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer padding
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            break
        assert pos + 7 + n <= len(data), "a record cut short"
        part += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # full or last: a whole record
            record = pb.Record()
            record.ParseFromString(part)
            records.append(record)
            part = b""
    return records


def test_wandb_offline_run_read_back(tok, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    tr = make_trainer(tok, tmp_path, report_to=("wandb",), eval_every=2)
    tr.train(2)
    wandb.teardown()  # the run was finished by on_train_end; this waits for wandb's service to close its files
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(runs) == 1
    records = read_wandb_records(Path(runs[0]))
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == [0, 1, 2]
    for h, row in zip(history, tr.rows):
        for k, v in row.items():
            assert same(float(h[k]), float(v)) if isinstance(v, float) else h[k] == v, k
    assert [(h["_step"], h["samples/nrows"]) for h in history if "samples/nrows" in h] == [(0, SAMPLE_ROWS),
                                                                                          (2, SAMPLE_ROWS)]
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "GRPO-seed0" and run.run_group == "GRPO"
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["trainer"]["lr"] == tr.config.lr and config["algorithm"]["name"] == "GRPO"
    tables = glob.glob(str(Path(runs[0]).parent / "files" / "media" / "table" / "samples_2_*.table.json"))
    table = json.loads(Path(tables[0]).read_text())
    assert table["columns"][:3] == ["prompt", "answer", "completion"] and len(table["data"]) == SAMPLE_ROWS


# --------------------------------------------------------------------------------------------- errors
def test_trackers_without_an_output_dir_warn(tok):
    with pytest.warns(RuntimeWarning, match=r"output_dir is None: tensorboard write nothing"):
        make_trainer(tok, None, report_to=("jsonl", "tensorboard"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_trainer(tok, None)  # the default ("jsonl",) without a directory: the usual case, silent


def test_unknown_tracker_is_named_with_a_suggestion(tok, tmp_path):
    with pytest.raises(ValueError, match=r"unknown tracker 'tensorbord' \(did you mean 'tensorboard'\?\); known: "
                                         r"jsonl, tensorboard, wandb"):
        make_trainer(tok, tmp_path, report_to=("tensorbord",))
    with pytest.raises(ValueError, match="unknown tracker 'nope'"):
        make_callbacks(("nope",), None)  # checked without an output_dir too
    assert make_callbacks(("jsonl",), None) == []


def test_missing_tracker_package_names_it(tmp_path, monkeypatch):
    real = cb_mod.importlib.util.find_spec
    monkeypatch.setattr(cb_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match="pip install wandb"):
        make_callbacks(("jsonl", "wandb"), tmp_path)


@pytest.mark.parametrize("bad, match", [
    (Recorder(), "must be a list"), ("jsonl", "must be a list"), (["jsonl"], "report_to"),
    ([Recorder], "not an instance"), ([object()], "none of the hooks")])
def test_bad_callbacks_are_refused(tok, bad, match):
    with pytest.raises(TypeError, match=match):
        make_trainer(tok, None, callbacks=bad)


def test_cli_report_to(fake_run_kwargs):
    calls = fake_run_kwargs
    assert cli.main(["GRPO", "--seeds", "0", "--report-to", "tensorboard", "wandb", "--out", calls.out]) == 0
    assert calls[-1]["report_to"] == ("tensorboard", "wandb")
    assert cli.main(["GRPO", "--seeds", "0", "--report-to", "none", "--out", calls.out, "--overwrite"]) == 0
    assert calls[-1]["report_to"] == ()
    assert cli.main(["GRPO", "--seeds", "0", "--out", calls.out, "--overwrite"]) == 0
    assert "report_to" not in calls[-1]
    assert cli.main(["GRPO", "--report-to", "none", "jsonl", "--out", calls.out, "--overwrite"]) == 2
    assert cli.main(["GRPO", "--report-to", "mlflw", "--out", calls.out, "--overwrite"]) == 2
    assert cli.main(["GRPO", "--set", "report_to=jsonl", "--out", calls.out, "--overwrite"]) == 2
    assert sorted(TRACKERS) == ["jsonl", "tensorboard", "wandb"]


@pytest.fixture
def fake_run_kwargs(monkeypatch, tmp_path):
    """``experiments.run`` replaced by a recorder of its keyword arguments (no training)."""
    from grpo_lab import experiments
    from grpo_lab.experiments import RunResult

    class Calls(list):
        out = str(tmp_path / "res.json")

    calls = Calls()

    def fake(algo, **kwargs):
        calls.append(kwargs)
        rows = [{"algo": algo.name, "seed": 0, "step": k, "test_accuracy": 0.5} for k in (0, 1)]
        prov = {"steps": 1, "seeds": [0], "wall_seconds": 0.1, "cached_seeds": [], "algo": dataclasses.asdict(algo)}
        return RunResult(pd.DataFrame(rows), prov)

    monkeypatch.setattr(experiments, "run", fake)
    return calls


# ---------------------------------------------------------------------------------------------- SIGKILL
KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    import torch
    sys.path.insert(0, {tests!r})
    from _toys import TINY, HalfTask
    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.policy.models import build_char_tokenizer, tiny_policy
    from grpo_lab.training.trainer import Trainer, TrainerConfig

    class Kill:
        def on_step(self, trainer, row):
            if row["step"] == 3:  # the JSONL logger (a tracker) ran before this user callback
                os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=2, progress=False,
                        output_dir={out!r})
    Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=4), GRPO, cfg, callbacks=[Kill()]).train(10)
""")


def test_killed_run_has_logged_every_finished_step(tmp_path):
    script = KILLED_RUN.format(tests=str(REPO / "tests"), out=str(tmp_path / "run"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", GRPO_LAB_RUN_CACHE="off")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(math.isfinite(r["reward"]) for r in records[1:])
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert sorted({s["step"] for s in samples}) == [0, 2]
