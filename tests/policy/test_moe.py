"""Mixture-of-Experts policies and GSPO's Routing Replay (arXiv 2507.18071, §5.3): the tiny
Qwen3-MoE policy, its shipped base checkpoint, recording / replaying / comparing routing
(grpo_lab.policy.moe), and the trainer's ``routing_replay`` option and ``routing_change_frac`` column."""

import dataclasses
import json
import math

import pytest
import torch
from transformers import Qwen3MoeForCausalLM

import grpo_lab.training.update as update_mod  # where the update calls the routing functions
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import count_parameters, load_policy, tiny_policy
from grpo_lab.policy.moe import RoutingStore, is_moe, moe_routers, record_routing, replay_routing, routing_changes
from grpo_lab.policy.rollout import generate, policy_logprobs
from grpo_lab.tasks import ArithmeticTask
from grpo_lab.training.trainer import Trainer, TrainerConfig

from _toys import TINY, HalfTask

MOE = dataclasses.replace(TINY, arch="qwen3_moe", num_hidden_layers=2, num_experts=4, num_experts_per_tok=2)


@pytest.fixture
def moe(tok):
    return tiny_policy(tok, MOE, seed=0).eval()


def _experts_spy(model):
    """Hooks capturing the ``top_k_index`` each ``mlp.experts`` receives, per layer, per forward."""
    seen, handles = [[] for _ in moe_routers(model)], []
    blocks = [m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")]
    for j, b in enumerate(blocks):
        handles.append(b.experts.register_forward_hook(
            lambda mod, args, out, j=j: seen[j].append((args[1].detach().clone(), args[2].detach().clone()))))
    return seen, handles


def _rollout(tok, model, n=3, G=2, seed=0):
    torch.manual_seed(seed)
    task = ArithmeticTask(test_size=5)
    import numpy as np

    return generate(model, tok, task.sample(n, np.random.default_rng(seed)), group_size=G, max_new_tokens=8)


def _perturb_routers(model, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, r in moe_routers(model):
            r.weight.copy_(torch.randn(r.weight.shape, generator=g) * scale)


# ------------------------------------------------------------------------------------ the policy
def test_moe_policy_builds_with_the_configured_routing(tok):
    m = tiny_policy(tok, MOE, seed=0)
    assert isinstance(m, Qwen3MoeForCausalLM) and m.training
    cfg = m.config
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (4, 2, 64 // 4)
    assert cfg.norm_topk_prob is True and cfg.vocab_size == 52
    assert [n for n, _ in moe_routers(m)] == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert is_moe(m) and not is_moe(tiny_policy(tok, TINY))
    # Hand count, one layer (d=32, 2 heads of 16, 1 kv head, 4 experts of width 16):
    #   attention q 32*32 + k 32*16 + v 32*16 + o 32*32 = 3072, q_norm + k_norm 16 + 16 (no q/k/v bias)
    #   experts gate_up 4*32*32 = 4096 + down 4*32*16 = 2048, router 4*32 = 128, two RMSNorms 64
    #   -> 9440 per layer; embedding 52*32 = 1664 (tied head), final norm 32
    assert count_parameters(m) == 2 * 9440 + 1664 + 32


def test_moe_config_dict_and_validation(tok):
    assert "num_experts" not in TINY.to_dict()  # dense dicts (recorded in recipe.json) are unchanged
    d = MOE.to_dict()
    assert (d["arch"], d["num_experts"], d["num_experts_per_tok"], d["moe_intermediate_size"]) == ("qwen3_moe", 4, 2,
                                                                                                     None)
    for bad, match in [(dict(num_experts=1), "num_experts"), (dict(num_experts_per_tok=5), "num_experts_per_tok"),
                       (dict(num_experts_per_tok=0), "num_experts_per_tok"), (dict(moe_intermediate_size=0), "width")]:
        with pytest.raises(ValueError, match=match):
            tiny_policy(tok, dataclasses.replace(MOE, **bad))


def test_an_expert_width_that_is_not_a_multiple_of_4_is_refused_with_the_fix(tok):
    """transformers 5.x runs the experts through torch's grouped_mm, which fails at the first forward
    with "strides should be multiple of 16 bytes" for a float32 width such as 18; tiny_policy refuses it
    up front, naming the field, the value, the reason and the nearest multiples of 4."""
    for width, fix in ((18, "16 or 20"), (17, "16 or 20"), (2, "set moe_intermediate_size to 4$")):
        with pytest.raises(ValueError, match=rf"moe_intermediate_size = {width} is not a multiple of 4.*grouped_mm.*{fix}"):
            tiny_policy(tok, dataclasses.replace(MOE, moe_intermediate_size=width))
    with pytest.raises(ValueError, match=r"unset: intermediate_size // num_experts = 72 // 4\) = 18 .*16 or 20"):
        tiny_policy(tok, dataclasses.replace(MOE, intermediate_size=72))  # the derived width is checked too
    for width in (4, 20, 36):  # 36: the shipped arithmetic-moe-base
        m = tiny_policy(tok, dataclasses.replace(MOE, moe_intermediate_size=width))
        m(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()


def test_moe_save_load_round_trip_identical_logits(tok, tmp_path, moe):
    moe.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    loaded, tok2 = load_policy(tmp_path)
    assert type(loaded) is Qwen3MoeForCausalLM and not loaded.training
    assert loaded.config.num_experts == 4 and loaded.config.num_experts_per_tok == 2
    enc = tok(["1+2=", "9+9+9+9="], padding=True, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(moe(**enc).logits, loaded(**enc).logits)
    assert count_parameters(loaded) == count_parameters(moe)


# ------------------------------------------------------------------------------------ record / replay
def test_replay_reproduces_the_recorded_forward_bit_for_bit(tok, moe):
    ids = torch.randint(4, 52, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), record_routing(moe) as rec:
        a = moe(input_ids=ids).logits
    assert rec.indices.shape == (2, 3, 9, 2) and rec.indices.dtype == torch.long
    seen, handles = _experts_spy(moe)
    try:
        with replay_routing(moe, rec.indices) as free:  # with grad, as the loss forward runs
            b = moe(input_ids=ids).logits
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(a, b)  # same weights: the replayed forward is the recorded one, bit for bit
    assert torch.equal(free.indices, rec.indices)  # the routers would have chosen the same experts
    for j in range(2):  # the experts received exactly the recorded indices
        assert torch.equal(seen[j][0][0].reshape(3, 9, 2), rec.indices[j])
    assert not moe._forward_hooks and all(not r._forward_hooks for _, r in moe_routers(moe))  # hooks removed


def test_replay_after_a_weight_change_forces_old_experts_and_trains_the_router(tok, moe):
    ids = torch.randint(4, 52, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), record_routing(moe) as rec:
        moe(input_ids=ids)
    _perturb_routers(moe)  # a large change: free routing now differs on many tokens
    with torch.no_grad(), record_routing(moe) as now:
        moe(input_ids=ids)
    changed, compared = routing_changes(rec.indices, now.indices)
    assert compared == 2 * 2 * 8 and changed > 0
    seen, handles = _experts_spy(moe)
    logits_seen = []
    h_logits = moe_routers(moe)[0][1].register_forward_hook(lambda m, a, out: logits_seen.append(out[0]))
    try:
        moe.zero_grad()
        with replay_routing(moe, rec.indices) as free:
            moe(input_ids=ids).logits.logsumexp(-1).sum().backward()
    finally:
        h_logits.remove()
        for h in handles:
            h.remove()
    for j in range(2):
        assert torch.equal(seen[j][0][0].reshape(2, 8, 2), rec.indices[j])  # the old experts, not the new
    assert torch.equal(free.indices[0], now.indices[0])  # layer 0 sees the same input: it would route as now
    assert not torch.equal(free.indices[0], rec.indices[0])
    # gate weights: softmax over all experts of the current logits, at the replayed experts, renormalised
    probs = torch.softmax(logits_seen[0].detach().double(), -1)
    w = probs.gather(-1, rec.indices[0].reshape(-1, 2))
    w = w / w.sum(-1, keepdim=True)
    torch.testing.assert_close(seen[0][0][1].double(), w, rtol=1e-6, atol=1e-7)
    for _, r in moe_routers(moe):  # the router still learns under replay
        assert r.weight.grad is not None and r.weight.grad.abs().sum() > 0


def test_replay_without_renormalisation(tok):
    m = tiny_policy(tok, dataclasses.replace(MOE, norm_topk_prob=False), seed=0).eval()
    ids = torch.randint(4, 52, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), record_routing(m) as rec:
        a = m(input_ids=ids).logits
    _perturb_routers(m)
    seen, handles = _experts_spy(m)
    logits_seen = []
    h = moe_routers(m)[0][1].register_forward_hook(lambda mod, args, out: logits_seen.append(out[0]))
    try:
        with torch.no_grad(), replay_routing(m, rec.indices):
            m(input_ids=ids)
    finally:
        h.remove()
        for x in handles:
            x.remove()
    w = torch.softmax(logits_seen[0].double(), -1).gather(-1, rec.indices[0].reshape(-1, 2))
    torch.testing.assert_close(seen[0][0][1].double(), w, rtol=1e-6, atol=1e-7)  # not renormalised
    assert (seen[0][0][1].sum(-1) < 1 - 1e-3).any()
    assert a.shape == (2, 6, 52)


def test_row_subsets_and_other_padding_replay_at_the_right_positions(tok, moe):
    ro = _rollout(tok, moe, n=3, G=2)
    B, P, T = len(ro), ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    full_mask = torch.cat([ro.prompt_mask.bool(), ro.completion_mask.bool()], 1)
    assert (~full_mask).any()  # there is padding on both sides to get wrong
    store = RoutingStore(2, B, P, T, 2)
    # record in two length-sorted micro-batches, each trimmed to its own rows (as the trainer does)
    order = torch.argsort(ro.token_counts(), stable=True)
    with torch.no_grad():
        for rows in (order[:2], order[2:]):
            part = ro.select(rows)
            with record_routing(moe) as rec:
                policy_logprobs(moe, part)
            store.put(rows, rec.indices, part.prompt_ids.shape[1])
        with record_routing(moe) as whole:  # reference: the whole rollout in one forward
            ref_logp = policy_logprobs(moe, ro)
    assert store.recorded.all()
    stored = store.get(torch.arange(B), P, P + T)
    # every real position's record equals the whole-batch record at that position
    assert torch.equal(stored[:, full_mask], whole.indices[:, full_mask])
    assert (stored[:, ~full_mask][..., 0] == -1).any()  # some padding was never part of a forward
    _perturb_routers(moe)  # now free routing differs, so only exact alignment reproduces the records
    for rows in (torch.tensor([5, 0, 3]), torch.tensor([1]), torch.arange(B).flip(0)):
        part = ro.select(rows)
        Pp, L = part.prompt_ids.shape[1], part.prompt_ids.shape[1] + part.completion_ids.shape[1]
        seen, handles = _experts_spy(moe)
        try:
            with torch.no_grad(), replay_routing(moe, store.get(rows, Pp, L)):
                policy_logprobs(moe, part)
        finally:
            for h in handles:
                h.remove()
        real = torch.cat([part.prompt_mask.bool(), part.completion_mask.bool()], 1)
        cols = torch.arange(L) + (P - Pp)
        for j in range(2):
            used = seen[j][0][0].reshape(len(rows), L, 2)
            assert torch.equal(used[real], whole.indices[j][rows][:, cols][real])
    assert torch.isfinite(ref_logp).all()


def test_routing_store_validates_shapes():
    store = RoutingStore(2, 4, 3, 5, 2)
    with pytest.raises(ValueError, match="expected"):
        store.put(torch.tensor([0, 1]), torch.zeros(2, 3, 8, 2, dtype=torch.long), 3)  # 3 rows for 2
    with pytest.raises(ValueError, match="does not fit"):
        store.get(torch.tensor([0]), 4, 6)  # a prompt wider than the rollout's
    with pytest.raises(ValueError, match="does not fit"):
        store.put(torch.tensor([0]), torch.zeros(2, 1, 9, 2, dtype=torch.long), 3)  # longer than P + T


def test_replay_errors(tok, moe):
    ids = torch.randint(4, 52, (2, 5))
    with torch.no_grad(), record_routing(moe) as rec:
        moe(input_ids=ids)
    good = rec.indices
    with pytest.raises(ValueError, match=r"\[B, L\]"):  # recorded for another batch shape
        with torch.no_grad(), replay_routing(moe, good):
            moe(input_ids=ids[:, :4])
    assert all(not r._forward_hooks for _, r in moe_routers(moe))  # removed after the error too
    for bad, match in [(good[:1], "n_layers"), (good[..., :1], "top_k"), (good.float(), "integer"),
                       (good.clone().fill_(4), "outside"), (torch.stack([good[..., 0]] * 2, -1), "twice")]:
        with pytest.raises(ValueError, match=match):
            with replay_routing(moe, bad):
                pass
    partial = good.clone()
    partial[0, 0, 0, 1] = -1
    with pytest.raises(ValueError, match="some but not all"):
        with replay_routing(moe, partial):
            pass
    dense = tiny_policy(tok, TINY)
    assert moe_routers(dense) == []
    for cm in (record_routing(dense), replay_routing(dense, good)):
        with pytest.raises(ValueError, match="no Mixture-of-Experts"):
            with cm:
                pass
    with record_routing(moe) as two:
        with torch.no_grad():
            moe(input_ids=ids)
            moe(input_ids=ids)
    assert len(two.calls) == 2
    with pytest.raises(ValueError, match="2 forward passes"):
        two.indices


def test_unrecorded_tokens_route_freely(tok, moe):
    ids = torch.randint(4, 52, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), record_routing(moe) as rec:
        a = moe(input_ids=ids).logits
    none = torch.full_like(rec.indices, -1)
    with torch.no_grad(), replay_routing(moe, none):
        b = moe(input_ids=ids).logits
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------ the change metric
def test_routing_change_is_zero_without_an_update(tok, moe):
    ids = torch.randint(4, 52, (3, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), record_routing(moe) as a:
        moe(input_ids=ids)
    with torch.no_grad(), record_routing(moe) as b:
        moe(input_ids=ids)
    assert routing_changes(a.indices, b.indices) == (0, 2 * 3 * 7)


def test_routing_change_matches_a_hand_count():
    # 2 layers, 1 row, 4 positions, k = 2
    old = torch.tensor([[[[0, 1], [2, 3], [1, 0], [0, 2]]],
                        [[[3, 1], [0, 1], [2, 0], [-1, -1]]]])
    new = torch.tensor([[[[1, 0], [2, 1], [1, 0], [0, 3]]],   # same set (order differs), changed, same, changed
                        [[[1, 3], [0, 2], [3, 0], [0, 1]]]])  # same, changed, changed, not recorded in old
    assert routing_changes(old, new) == (4, 7)
    mask = torch.tensor([[0, 1, 1, 1]])  # the first position is a prompt token: not compared
    assert routing_changes(old, new, mask) == (4, 5)
    with pytest.raises(ValueError, match="one shape"):
        routing_changes(old, new[..., :1])
    with pytest.raises(ValueError, match="mask"):
        routing_changes(old, new, mask[:, :3])


# ------------------------------------------------------------------------------------ trainer
def _trainer(tok, policy, **kw):
    cfg = dict(prompts_per_step=4, group_size=4, max_new_tokens=8, eval_every=0, progress=False, lr=3e-2, seed=0,
               minibatches=2, micro_batch_size=4)
    cfg.update(kw)
    return Trainer(policy, tok, HalfTask(test_size=5), GRPO, TrainerConfig(**cfg))


def test_dense_policy_with_routing_replay_is_a_clear_error(tok):
    with pytest.raises(ValueError, match="no Mixture-of-Experts layers"):
        _trainer(tok, tiny_policy(tok, TINY), routing_replay=True)
    with pytest.raises(ValueError, match="TrainerConfig.routing_replay"):
        TrainerConfig(routing_replay=True, old_logp="behaviour")
    with pytest.raises(ValueError, match="TrainerConfig.routing_replay"):
        TrainerConfig(routing_replay=1)


@pytest.mark.parametrize("replay", [False, True])
def test_two_step_run_logs_the_routing_change(tok, replay, monkeypatch):
    puts, gets = [], []
    put, get = RoutingStore.put, RoutingStore.get

    def spy_put(self, rows, indices, prompt_width):
        puts.append((torch.as_tensor(rows).clone(), indices.clone(), prompt_width, self.prompt_width))
        return put(self, rows, indices, prompt_width)

    def spy_get(self, rows, prompt_width, length):
        out = get(self, rows, prompt_width, length)
        gets.append((torch.as_tensor(rows).clone(), prompt_width, length, out.clone()))
        return out

    monkeypatch.setattr(RoutingStore, "put", spy_put)
    monkeypatch.setattr(RoutingStore, "get", spy_get)
    replayed = []
    real_replay = update_mod.replay_routing
    monkeypatch.setattr(update_mod, "replay_routing", lambda m, idx: (replayed.append(idx), real_replay(m, idx))[1])
    tr = _trainer(tok, tiny_policy(tok, MOE, seed=0), routing_replay=replay)
    h = tr.train(2)
    assert "routing_change_frac" in h and h["routing_change_frac"].between(0, 1).all()
    assert h["routing_change_frac"].gt(0).any()  # lr 3e-2 on a random router moves some top-2 sets
    # π_old's routing of all 16 rows was recorded each step (no-grad recompute + on-policy first minibatch)
    per_step = len(puts) // 2
    for s in (0, 1):
        rows = torch.cat([p[0] for p in puts[s * per_step:(s + 1) * per_step]])
        assert sorted(rows.tolist()) == list(range(16))
    assert bool(replayed) == replay
    if replay:  # each replay read the recorded experts of exactly those rows at their own columns
        assert len(replayed) == 2 * 2  # 8 rows (2 whole groups) of the second minibatch in 2 micro-batches, per step
        recorded = {}  # row -> (its π_old routing, the first store column it was written at), step 1
        for rows, idx, pw, P in puts[:per_step]:
            for i, r in enumerate(rows.tolist()):
                recorded[r] = (idx[:, i], P - pw)
        P = puts[0][3]
        for rows, pw, length, out in gets[:len(gets) // 2]:  # step 1's reads
            for i, r in enumerate(rows.tolist()):
                idx, off = recorded[r]  # written at store columns off .. off + idx.shape[1]
                lo = P - pw  # this forward reads store columns lo .. lo + length
                expected = torch.full_like(out[:, i], -1)
                a, b = max(lo, off), min(lo + length, off + idx.shape[1])
                expected[:, a - lo:b - lo] = idx[:, a - off:b - off]
                assert torch.equal(out[:, i], expected)
        assert all(any(torch.equal(x, g[3]) for g in gets) for x in replayed)  # what was forced is what was read
    # the metric is that of the second minibatch's forward against π_old's record
    assert not math.isnan(h["routing_change_frac"].iloc[0])


def test_routing_change_counts_the_completion_tokens_of_the_second_minibatch(tok, monkeypatch):
    # Decisions compared = MoE layers x real completion tokens of the rows trained after the first
    # update (prompt tokens and padding are not counted); the logged value is changed / compared.
    calls, puts = [], []
    real_changes, put = update_mod.routing_changes, RoutingStore.put
    monkeypatch.setattr(update_mod, "routing_changes", lambda o, n, m: calls.append(real_changes(o, n, m)) or calls[-1])
    monkeypatch.setattr(RoutingStore, "put", lambda self, rows, idx, pw: (puts.append(torch.as_tensor(rows).clone()),
                                                                          put(self, rows, idx, pw))[1])
    tr = _trainer(tok, tiny_policy(tok, MOE, seed=0), lr=0.1)
    batches, collect = [], tr.collect
    monkeypatch.setattr(tr, "collect", lambda: batches.append(collect()) or batches[-1])
    h = tr.train(1)
    # the no-grad π_old forward (2 chunks of 4 rows) scores exactly the second minibatch's 8 rows (2 whole groups)
    rows2, rows1 = torch.cat(puts[:2]), torch.cat(puts[2:])
    assert len(rows2) == 8 and not set(rows2.tolist()) & set(rows1.tolist())
    tokens = int(batches[0].rollout.completion_mask[rows2].sum())
    changed, compared = sum(c for c, _ in calls), sum(n for _, n in calls)
    assert len(calls) == 2 and compared == 2 * tokens  # 2 MoE layers
    assert 0 < changed < compared
    assert h["routing_change_frac"].iloc[0] == pytest.approx(changed / compared)


def test_routing_change_frac_is_nan_when_undefined(tok):
    h = _trainer(tok, tiny_policy(tok, TINY)).train(1)  # dense
    assert math.isnan(h["routing_change_frac"].iloc[0])
    h = _trainer(tok, tiny_policy(tok, MOE), minibatches=1).train(1)  # one optimiser step per rollout
    assert math.isnan(h["routing_change_frac"].iloc[0])
    h = _trainer(tok, tiny_policy(tok, MOE), old_logp="behaviour").train(1)  # π_old's routing is not recorded
    assert math.isnan(h["routing_change_frac"].iloc[0])


def test_replay_changes_the_update_only_when_routing_moved(tok):
    # With a tiny learning rate routing does not move, so replay changes nothing: same history and weights.
    # With a large one it does, and the second minibatch's loss (hence the weights) differ.
    def run(replay, lr):
        tr = _trainer(tok, tiny_policy(tok, MOE, seed=0), routing_replay=replay, lr=lr)
        h = tr.train(1)
        return h, [p.detach().clone() for p in tr.policy.parameters()]

    (h0, w0), (h1, w1) = run(False, 1e-7), run(True, 1e-7)
    assert h0["routing_change_frac"].iloc[0] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(w0, w1))
    (h2, w2), (h3, w3) = run(False, 0.1), run(True, 0.1)
    assert h2["routing_change_frac"].iloc[0] > 0
    assert any(not torch.equal(a, b) for a, b in zip(w2, w3))


def test_config_hash_and_profile_with_the_moe_base():
    from grpo_lab.experiments import PROFILES, config_hash, run, run_fingerprint

    cpu = PROFILES["cpu"]
    moe_prof = dataclasses.replace(cpu, base="arithmetic-moe-base")
    replay = dataclasses.replace(moe_prof, config=dataclasses.replace(moe_prof.config, routing_replay=True))
    hashes = {config_hash(GRPO, p, 2) for p in (cpu, moe_prof, replay)}
    assert len(hashes) == 3
    assert TrainerConfig.from_dict(json.loads(json.dumps(replay.config.to_dict()))) == replay.config
    assert run_fingerprint(moe_prof) != run_fingerprint(cpu)  # the run cache keys on the base checkpoint
    res = run(GRPO, profile=moe_prof, seeds=[0], steps=1, cache=False, routing_replay=True, prompts_per_step=2,
              group_size=4, micro_batch_size=None, eval_every=0)
    assert res.provenance["base"] == "arithmetic-moe-base" and res.provenance["config"]["routing_replay"] is True
    assert res.history["routing_change_frac"].between(0, 1).all()


# ------------------------------------------------------------------------------------ the shipped MoE base
MOE_BASE = "arithmetic-moe-base"


@pytest.fixture(scope="module")
def moe_record():
    from grpo_lab.paths import checkpoint_dir

    return json.loads((checkpoint_dir(MOE_BASE) / "recipe.json").read_text())


def test_moe_base_checkpoint_matches_its_recipe(moe_record):
    from grpo_lab.paths import checkpoint_dir
    from grpo_lab.lab.pretrain import RECIPES, sha256_file

    base = checkpoint_dir(MOE_BASE)
    # produced by `python -m grpo_lab.lab.pretrain arithmetic-moe`: arithmetic-base's recipe, another model
    assert moe_record["recipe"] == RECIPES["arithmetic-moe"].to_dict()
    dense = RECIPES["arithmetic"].to_dict()
    assert {k: v for k, v in moe_record["recipe"].items() if k != "model"} == {k: v for k, v in dense.items()
                                                                               if k != "model"}
    assert sha256_file(base / "model.safetensors") == moe_record["model_sha256"]
    assert (base / "model.safetensors").stat().st_size < 2 * 2**20  # about the dense checkpoint's 1.3 MB
    model, tok = load_policy(MOE_BASE, progress=False)
    assert isinstance(model, Qwen3MoeForCausalLM) and len(moe_routers(model)) == 3
    assert (model.config.num_experts, model.config.num_experts_per_tok) == (8, 2)
    assert count_parameters(model) == moe_record["parameters"]


def test_moe_base_accuracy_is_in_the_dense_band_and_reproduces(moe_record):
    from grpo_lab.paths import checkpoint_dir
    from grpo_lab.lab.pretrain import RECIPES, make_task
    from grpo_lab.policy.rollout import evaluate

    m = moe_record["metrics"]
    dense = json.loads((checkpoint_dir("arithmetic-base") / "recipe.json").read_text())["metrics"]
    # the band the dense base is held to (test_checkpoint); at 0.24 it sits below the dense 0.40, with
    # the same response-length spread and reasoning rate (the recipe's data mixture) and room for RL
    assert 0.20 <= m["greedy_accuracy"] <= 0.60 and 0.20 <= dense["greedy_accuracy"] <= 0.60
    assert abs(m["sampled_reasoning_frac"] - dense["sampled_reasoning_frac"]) <= 0.05
    assert 0.05 <= m["sampled_reasoning_frac"] <= 0.6 and m["sampled_length_sd"] > 3.0  # room for RL
    model, tok = load_policy(MOE_BASE, progress=False)
    summary, _ = evaluate(model, tok, make_task(RECIPES["arithmetic-moe"]), greedy=True)
    assert abs(summary["accuracy"] - m["greedy_accuracy"]) <= 0.015


def test_moe_pretraining_is_deterministic(tmp_path, monkeypatch):
    # two short runs of the MoE recipe (router load-balancing loss included) give bit-identical weights
    from grpo_lab.lab.pretrain import RECIPES, pretrain

    monkeypatch.setenv("GRPO_LAB_DATA", str(tmp_path / "data"))
    small = dataclasses.replace(RECIPES["arithmetic-moe"], steps=3, batch_size=8, warmup=2)
    a = pretrain(small, tmp_path / "a", progress=False, evaluate=False, name="arithmetic-moe")
    b = pretrain(small, tmp_path / "b", progress=False, evaluate=False, name="arithmetic-moe")
    c = pretrain(dataclasses.replace(small, seed=1), tmp_path / "c", progress=False, evaluate=False)
    assert a["model_sha256"] == b["model_sha256"] != c["model_sha256"]
    assert a["recipe"]["model"]["arch"] == "qwen3_moe"


def test_moe_policy_runs_in_bfloat16_and_float32_keeps_its_experts_implementation():
    # grouped_mm needs 16-byte strides; width-36 bfloat16 rows are 72 bytes (it raised RuntimeError)
    import numpy as np

    from grpo_lab.policy.models import inference_copy, load_policy
    from grpo_lab.policy.rollout import generate
    from grpo_lab.tasks import get_task

    problems = get_task("arithmetic").sample(2, np.random.default_rng(0))
    bf16, tok = load_policy("arithmetic-moe-base", dtype=torch.bfloat16)
    assert bf16.config._experts_implementation == "eager"
    assert generate(bf16, tok, problems, group_size=2, max_new_tokens=6).completion_ids.shape[0] == 4
    fp32, _ = load_policy("arithmetic-moe-base")
    default = fp32.config._experts_implementation
    copy16 = inference_copy(fp32)
    assert generate(copy16, tok, problems, group_size=2, max_new_tokens=6).completion_ids.shape[0] == 4
    assert copy16.config._experts_implementation == "eager" and fp32.config._experts_implementation == default


def test_routing_store_rejects_a_boolean_mask_and_out_of_range_rows():
    store = RoutingStore(1, 2, 1, 2, 2)
    idx = torch.zeros(1, 2, 3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="integer row indices"):
        store.put(torch.tensor([True, False]), idx[:, :2], 1)  # as_tensor(long) would have read rows [1, 0]
    with pytest.raises(ValueError, match=r"within|lie in"):
        store.put(torch.tensor([0, 2]), idx, 1)
    with pytest.raises(ValueError, match="integer row indices"):
        store.get(torch.tensor([True, True]), 1, 3)
    store.put(torch.tensor([1, 0]), torch.arange(12).view(1, 2, 3, 2), 1)
    assert torch.equal(store.get(torch.tensor([0]), 1, 3)[0, 0], torch.arange(6, 12).view(3, 2))


def test_routing_update_records_the_experts_before_and_after_the_update():
    """lab.routing_update (chapter 4 §4.6, benchmarks/moe_granularity.py): at lr 1e-30 (the trainer refuses 0)
    the update moves no float32 weight, so the experts and log-probs recorded after it equal those before, bit for bit; at the profile's
    rate, past the warm-up, some routing decisions change. A dense policy is refused by record_routing."""
    import dataclasses

    from grpo_lab import experiments, lab
    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.policy.models import load_policy
    from grpo_lab.tasks import get_task
    from grpo_lab.training.trainer import Trainer

    prof = experiments.get_profile("cpu")
    task = get_task(prof.task, **dict(prof.task_kwargs))
    algo = GRPO.replace(kl=None, beta=0.0)
    for lr, moved in ((1e-30, False), (3e-3, True)):
        pol, tok = load_policy("arithmetic-moe-base")
        cfg = dataclasses.replace(prof.config, seed=0, lr=lr, warmup=0, minibatches=2, prompts_per_step=4,
                                  eval_every=0, progress=False, threads=1)
        batch, updates, (old, lp_old), (new, lp_new) = lab.routing_update(Trainer(pol, tok, task, algo, cfg))
        layers = sum(1 for m in pol.modules() if type(m).__name__.endswith("SparseMoeBlock"))
        assert old.indices.shape == new.indices.shape and old.indices.shape[:2] == (layers, batch.rollout.completion_ids.shape[0])
        assert lp_old.dtype == torch.float64 and lp_old.shape == batch.rollout.completion_ids.shape and len(updates) == 2
        assert bool((old.indices != new.indices).any()) is moved
        assert torch.equal(lp_old, lp_new) is not moved
    dense, tok = load_policy("arithmetic-base")
    with pytest.raises(ValueError, match="MoE"):
        lab.routing_update(Trainer(dense, tok, task, algo, dataclasses.replace(
            prof.config, prompts_per_step=2, eval_every=0, progress=False)))


# ------------------------------------------------------------------------------------ sampler vs learner (issue 55)
def test_expert_changes_matches_a_hand_count():
    from grpo_lab.policy.moe import expert_changes

    # routing_changes' example: 2 layers, 1 row, 4 positions, k = 2
    old = torch.tensor([[[[0, 1], [2, 3], [1, 0], [0, 2]]],
                        [[[3, 1], [0, 1], [2, 0], [-1, -1]]]])
    new = torch.tensor([[[[1, 0], [2, 1], [1, 0], [0, 3]]],
                        [[[1, 3], [0, 2], [3, 0], [0, 1]]]])
    # by hand, the experts of `old` not in `new`'s set: layer 0: -, 3, -, 2; layer 1: -, 1, 2, (not recorded)
    # -> 4 gone of 2 x 7 = 14 activated; without position 0: 4 of 2 x 5 = 10
    assert expert_changes(old, new) == (4, 14)
    assert expert_changes(old, new, torch.tensor([[0, 1, 1, 1]])) == (4, 10)
    # a whole set swapped counts k, one member swapped 1 (routing_changes counts both as one changed set)
    assert expert_changes(torch.tensor([[[[0, 1], [0, 1]]]]), torch.tensor([[[[2, 3], [0, 3]]]])) == (3, 4)
    assert expert_changes(old, old) == (0, 14)
    with pytest.raises(ValueError, match="one shape"):
        expert_changes(old, new[..., :1])
    with pytest.raises(ValueError, match="mask"):
        expert_changes(old, new, torch.ones(1, 3))


def _swap_last_router(model, a=0, b=1):
    """A float32 copy of ``model`` whose last MoE router has experts ``a`` and ``b``'s rows swapped: the last
    layer then picks the set of ``model`` with a and b exchanged; nothing before it changes."""
    import copy

    out = copy.deepcopy(model).eval()
    _, router = moe_routers(out)[-1]
    with torch.no_grad():
        router.weight[[a, b]] = router.weight[[b, a]].clone()
    return out


def test_sampler_routing_is_zero_for_one_model_and_the_hand_count_for_a_perturbed_router(tok, monkeypatch):
    import grpo_lab.policy.models as models_mod
    from grpo_lab import lab
    from grpo_lab.policy.moe import record_routing

    # float32 sampler: the sampler is the learner, nothing differs, also per layer
    same = lab.sampler_routing(_trainer(tok, tiny_policy(tok, MOE, seed=0), rollout_dtype="float32"), after=())
    assert same["before"] == 0.0 and same["before_by_layer"] == [0.0, 0.0] and same["activated"] > 0
    assert same["updates"] == 0 and same["after"] == {}
    # a sampler whose last router has experts 0 and 1 exchanged (monkeypatched for the probe's copy only)
    monkeypatch.setattr(models_mod, "inference_copy", lambda model, dtype, fp32_lm_head=False: _swap_last_router(model))
    tr = _trainer(tok, tiny_policy(tok, MOE, seed=0), rollout_dtype="bfloat16")
    state = {k: v.clone() for k, v in tr.policy.state_dict().items()}
    captured = {}
    collect = tr.collect
    tr.collect = lambda: captured.setdefault("batch", collect())
    got = lab.sampler_routing(tr, after=())
    assert all(torch.equal(v, tr.policy.state_dict()[k]) for k, v in state.items())  # after=(): no update
    ro = captured["batch"].rollout
    P, T = ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    with torch.no_grad(), record_routing(tr.policy) as rec:
        policy_logprobs(tr.policy, ro)
    last = rec.indices[-1, :, P - 1:P - 1 + T]  # [B, T, k] the learner's last layer
    real = captured["batch"].loss_mask[:, :T].bool()
    # by hand: the sampler's set is the learner's with 0 and 1 exchanged, so one of its experts is not the
    # learner's exactly when the learner's set holds one of {0, 1} but not both; k = 2 slots x 2 layers per token
    one_of = ((last == 0).any(-1) ^ (last == 1).any(-1)) & real
    assert one_of.any()  # the check bites
    assert got["before"] == pytest.approx(int(one_of.sum()) / (2 * 2 * int(real.sum())), abs=0)
    assert got["before_by_layer"][0] == 0.0 and got["before_by_layer"][1] == pytest.approx(
        int(one_of.sum()) / (2 * int(real.sum())), abs=0)
    assert got["fp32_head_routing_differs"] == 0 and got["activated"] == 2 * 2 * int(real.sum())


def test_sampler_routing_after_k_updates_and_its_errors(tok):
    from grpo_lab import lab

    # lr 1e-30 moves no float32 weight: after 1 and 2 optimiser steps the learner routes as before (0 with a
    # float32 sampler); a step beyond the update's 2 is left out
    tr = _trainer(tok, tiny_policy(tok, MOE, seed=0), rollout_dtype="float32", lr=1e-30)
    got = lab.sampler_routing(tr, after=(1, 2, 5))
    assert got["updates"] == 2 and got["after"] == {1: 0.0, 2: 0.0}
    # at lr 3e-2 the updates move some experts
    moved = lab.sampler_routing(_trainer(tok, tiny_policy(tok, MOE, seed=0), rollout_dtype="bfloat16"), after=(2,))
    assert moved["after"][2] > 0 and 0 <= moved["before"] < 1
    with pytest.raises(ValueError, match="no Mixture-of-Experts"):
        lab.sampler_routing(_trainer(tok, tiny_policy(tok, TINY)))
    with pytest.raises(ValueError, match="routing_replay"):
        lab.sampler_routing(_trainer(tok, tiny_policy(tok, MOE, seed=0), routing_replay=True))
    with pytest.raises(ValueError, match=">= 1"):
        lab.sampler_routing(_trainer(tok, tiny_policy(tok, MOE, seed=0)), after=(0,))
