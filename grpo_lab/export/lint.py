"""The linter: read a TRL or verl configuration back as the grpo_lab Algorithm it computes, and say which
paper's objective that is and where it departs.

:func:`grpo_lab.export.translation.to_trl` / :func:`~grpo_lab.export.translation.to_verl` go from an algorithm to a library's
settings; this module goes back:

* :func:`from_trl` — a ``trl.GRPOConfig``, a dict of its fields or a YAML file of them (TRL 1.16.0);
* :func:`from_verl` — verl 0.9.1's trainer config as a nested dict (``ppo_trainer.yaml``), a YAML file,
  or a list of Hydra overrides (what ``to_verl`` returns);
* :func:`check_config` — either, from a file, the library told or guessed from the keys
  (``python -m grpo_lab check-config FILE``).

Fields the configuration leaves out take the library's defaults, recorded as data in
:mod:`grpo_lab.export.library_defaults` (so neither library needs to be installed). Each returns a
:class:`Reading`: the :class:`~grpo_lab.algo.algorithms.Algorithm` whose loss equals the library's
(``tests/export/xcheck/test_xcheck_lint.py`` checks it against TRL's and verl's own loss code), the paper it is
nearest to (the preset with the fewest departures), the departures as one line each (from the paper,
and whatever the library computes that no Algorithm field expresses, e.g. verl's dual clip; then
``exact`` is False and the Algorithm is the nearest), the settings read outside the loss, and the keys
not recognised.

The reading inverts the export's mapping tables (:mod:`grpo_lab.export.translation`) and is then
exported back and compared key by key (:func:`grpo_lab.export.lint_base.verify`): one source of truth.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ..algo import selection as _selection
from ..algo.algorithms import PRESETS, Algorithm, deepseek_v32
from . import library_defaults as _D
from .lint_base import Draft, did_you_mean
from .lint_io import load_yaml, trl_values, verl_values
from .lint_trl import read_trl, verify_trl
from .lint_verl import read_verl, verify_verl

__all__ = ["Reading", "from_trl", "from_verl", "check_config", "guess_library", "LIBRARIES"]

#: the libraries the linter reads (``--library``)
LIBRARIES = ("trl", "verl")
_LABEL = {"trl": f"TRL {_D.TRL_DEFAULTS_VERSION} GRPOConfig", "verl": f"verl {_D.VERL_DEFAULTS_VERSION} trainer config"}
#: candidate papers: preset key -> (label, the equation of its loss)
_PAPERS = {
    "GRPO": ("GRPO (DeepSeekMath, arXiv 2402.03300)", "Eq. 3"),
    "DR_GRPO": ("Dr. GRPO (arXiv 2503.20783)", "§3.2"),
    "DAPO": ("DAPO (arXiv 2503.14476)", "Eq. 12"),
    "GSPO": ("GSPO (arXiv 2507.18071)", "Eq. 5"),
    "CISPO": ("CISPO (MiniMax-M1, arXiv 2506.13585)", "Eq. 4"),
    "DeepSeek-V3.2": ("DeepSeek-V3.2 (arXiv 2512.02556)", "Eq. 5"),
    "GMPO": ("GMPO (arXiv 2507.20673)", "Eq. 4"),
    "SAPO": ("SAPO (arXiv 2511.20347)", "§3"),
    "PPO": ("PPO (arXiv 1707.06347, as VAPO's baseline)", "its loss"),
    "KL_COV": ("KL-Cov (arXiv 2505.22617)", "its loss"),
    "CLIP_COV": ("Clip-Cov (arXiv 2505.22617)", "its loss"),
    "VAPO": ("VAPO (arXiv 2504.05118)", "its loss"),
}
_ADV = {"group": "group z-score advantages", "group_mean": "r - mean advantages (no std)",
        "batch": "group-mean / batch-std advantages", "rloo": "leave-one-out advantages",
        "gae": "critic (GAE) advantages"}
_RATIO = {"token": "token ratios", "sequence": "the sequence ratio (GSPO Eq. 7)",
          "sequence_token": "GSPO-token ratios (Eq. 14)"}
_SURROGATE = {"ppo": "the PPO clip", "cispo": "CISPO's clipped importance weight", "gmpo": "GMPO's geometric mean",
         "sapo": "SAPO's soft gate", "kl_cov": "KL-Cov's covariance penalty", "clip_cov": "Clip-Cov's detachment"}
_AGG = {"seq_mean_token_mean": "per-sequence token mean", "token_mean": "token mean over the whole batch",
        "group_token_mean": "per-group token mean", "seq_mean_token_sum_norm": "token sum over a constant"}


@dataclass(frozen=True)
class Reading:
    """What a TRL or verl configuration computes, in grpo_lab's terms (see the module docstring).

    Attributes:
        library: ``"trl"`` or ``"verl"``.
        source: the file read, or None.
        algorithm: the :class:`~grpo_lab.algo.algorithms.Algorithm` whose loss equals the library's (when
            :attr:`exact`), else the nearest.
        exact: False when the library computes something no Algorithm field expresses (:attr:`inexact`).
        paper: the paper the configuration is nearest to (its label, e.g. ``"DAPO (arXiv 2503.14476)"``).
        preset: that paper's preset key (``"DAPO"``, ``"DeepSeek-V3.2"``, ...).
        departures: one line per departure from :attr:`paper`, then one per :attr:`inexact` item.
        inexact: what the library computes that the Algorithm does not (empty when :attr:`exact`).
        notes: settings read that are outside the loss (optimiser, schedule, precision, sampling, sizes).
        unknown: keys not recognised (each with a did-you-mean where one is close).
        named: ``(preset key, the setting)`` of the paper the configuration names by its choices, or None.
        named_departures: the number of departures from the named paper (None when nothing is named).
        settings: the TrainerConfig-side settings read (the budget the reading is checked with): ``max_new_tokens``,
            ``precision``, ``group_size``, the sampler's (``rollout_dtype``, ``top_p``, ``top_k``, ``old_logp``)
            and, for verl's critic, ``value_lr`` (``critic.optim.lr``) and ``value_warmup_steps``
            (``trainer.critic_warmup``); those the configuration implies, as the export takes them.
    """

    library: str
    source: Optional[str]
    algorithm: Algorithm
    exact: bool
    paper: str
    preset: str
    departures: tuple
    inexact: tuple
    notes: tuple
    unknown: tuple
    named: Optional[tuple] = None
    named_departures: Optional[int] = None
    settings: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def summary(self) -> str:
        """``"DAPO (arXiv 2503.14476), except: ...; ..."`` (or ``"..., exactly"``), one line."""
        if not self.departures:
            return f"{self.paper}, exactly"
        return f"{self.paper}, except: " + "; ".join(self.departures)

    def report(self) -> str:
        """The text ``python -m grpo_lab check-config`` prints: summary, Algorithm, departures, notes, unknown."""
        head = _LABEL[self.library] + (f" ({self.source})" if self.source else "")
        lines = [head, "computes: " + self.summary,
                 "grpo_lab: " + _algorithm_text(self.algorithm, self.preset)
                 + ("" if self.exact else "   [nearest: not exact, see departures]")]
        if self.named and self.named[0] != self.preset:
            lines.append(f"named: {_PAPERS[self.named[0]][0]} by {self.named[1]} ({self.named_departures} "
                         f"departures from it)")
        for title, items in (("departures", self.departures), ("notes", self.notes), ("unknown keys", self.unknown)):
            if items:
                lines.append(title + ":")
                lines += ["  - " + i for i in items]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the paper and the departures
# ---------------------------------------------------------------------------------------------
def _candidate(key: str, algo: Algorithm) -> Algorithm:
    """The paper's algorithm; DeepSeek-V3.2 takes the reading's beta, delta and eps (the paper reports none)."""
    if key != "DeepSeek-V3.2":
        return PRESETS[key]
    return deepseek_v32(beta=algo.beta if algo.uses_kl else 0.001, eps=min(algo.eps_low, 1.0),
                        delta=algo.offpolicy_mask_delta if algo.offpolicy_mask_delta is not None else 0.5)


def _aspects(a: Algorithm, l_max: int) -> dict:
    """``{aspect: (comparable value, text)}`` of an algorithm's loss and sampling."""
    out = {"advantage": (a.advantage, _ADV.get(a.advantage, a.advantage)),
           "ratio": (a.ratio_level, _RATIO.get(a.ratio_level, a.ratio_level)),
           "surrogate": (a.surrogate, _SURROGATE.get(a.surrogate, a.surrogate)),
           "aggregation": ((a.aggregation, a.max_tokens), _AGG.get(a.aggregation, a.aggregation)
                           + (f" (max_tokens = {a.max_tokens})" if a.max_tokens else "")),
           "KL": ((a.kl, a.beta) if a.uses_kl else None,
                  f"{a.kl} KL with beta = {a.beta:g}" if a.uses_kl else "no KL term"),
           "off-policy masking": (a.offpolicy_mask_delta, "no Off-Policy Sequence Masking" if a.offpolicy_mask_delta
                                  is None else f"Off-Policy Sequence Masking delta = {a.offpolicy_mask_delta:g}"),
           "dynamic sampling": (a.dynamic_sampling, "dynamic sampling" if a.dynamic_sampling
                                else "no dynamic sampling"),
           "overlong filtering": (a.overlong_filter, "Overlong Filtering" if a.overlong_filter
                                  else "no Overlong Filtering")}
    if a.advantage in ("group", "batch"):
        out["adv_eps"] = (a.adv_eps, f"std + {a.adv_eps:g}")
    if a.surrogate in ("ppo", "cispo", "gmpo", "clip_cov"):
        out["clip range"] = ((a.eps_low, a.eps_high), f"clip range eps_low = {a.eps_low:g}, eps_high = {a.eps_high:g}")
    if a.uses_kl:
        out["KL correction"] = (a.kl_importance_correction, "the importance-corrected KL (V3.2 Eq. 7)"
                                if a.kl_importance_correction else "the plain KL estimate")
    cache = _selection.overlong_cache_tokens(a, l_max) if 2 * (a.overlong_cache_len or 0) <= l_max else \
        a.overlong_cache_len
    out["soft overlong punishment"] = (cache, "no soft overlong punishment" if cache is None
                                       else f"soft overlong punishment over L_cache = {cache} tokens")
    if a.advantage == "gae":
        out.update(_value_aspects(a))
    out["hyper-parameters"] = (dict(a.params), ", ".join(f"{k} = {v:g}" for k, v in a.params.items()) or "none")
    return out


def _value_aspects(a: Algorithm) -> dict:
    """The value-model aspects of a GAE algorithm (PPO, VAPO): GAE's gamma and lambdas, the value clip, the NLL."""
    lams = f"GAE gamma = {a.gamma:g}, lam = " + ("length-adaptive 1 - 1/(alpha l), alpha = " + f"{a.lam_alpha:g}"
                                                 if a.lam_alpha is not None else f"{a.lam:g}")
    lams += "" if a.critic_lam is None else f", critic_lam = {a.critic_lam:g}"
    lam = None if a.lam_alpha is not None else a.lam
    return {"GAE": ((a.gamma, lam, a.lam_alpha, a.critic_lam), lams),
            "value clip": (a.value_clip_eps, "no value clip" if a.value_clip_eps is None
                           else f"value clip {a.value_clip_eps:g}"),
            "NLL": (a.nll_coef, "no positive-example NLL" if not a.nll_coef
                    else f"positive-example NLL with weight {a.nll_coef:g}")}


#: how much a departure on each aspect weighs when the nearest paper is chosen: the surrogate is the loss's
#: family (the clip range and the hyper-parameters then differ with it and are not counted again); no paper fixes
#: adv_eps; sampling settings count half (TRL cannot express dynamic sampling, nor show a reward function), and so
#: do the critic's hyper-parameters (GAE's gamma / lambdas, the value clip: compared between GAE algorithms only)
_WEIGHTS = {"surrogate": 4.0, "ratio": 2.0, "advantage": 2.0, "adv_eps": 0.0, "dynamic sampling": 0.5,
            "overlong filtering": 0.5, "soft overlong punishment": 0.5, "GAE": 0.5, "value clip": 0.5}


def _departures(algo: Algorithm, paper: Algorithm, eq: str, l_max: int) -> list:
    """``[(weight, "X instead of Y")]``, one per aspect in which ``algo`` differs from ``paper``."""
    mine, theirs = _aspects(algo, l_max), _aspects(paper, l_max)
    same_family = algo.surrogate == paper.surrogate
    out = []
    for aspect, (value, text) in mine.items():
        if aspect not in theirs or (aspect in ("clip range", "hyper-parameters") and not same_family):
            continue
        if aspect == "aggregation" and value[0] == theirs[aspect][0][0] and paper.max_tokens is None:
            continue  # the paper's constant is the generation budget, whatever it is
        if value != theirs[aspect][0]:
            other = theirs[aspect][1]
            line = f"{text} instead of {eq}'s {other}" if aspect == "aggregation" else f"{text} instead of {other}"
            out.append((_WEIGHTS.get(aspect, 1.0), line))
    return out


def _match(algo: Algorithm, named: Optional[tuple], l_max: int) -> tuple:
    """``(preset key, departures, departures from the named paper or None)``: the paper with the fewest
    departures (weighted by :data:`_WEIGHTS`) wins, then the paper the config names."""
    scored = []
    for i, key in enumerate(_PAPERS):
        deps = _departures(algo, _candidate(key, algo), _PAPERS[key][1], l_max)
        scored.append((sum(w for w, _ in deps), 0 if named and named[0] == key else 1, i, key,
                       [line for _, line in deps]))
    best = min(scored)
    named_count = next((len(s[4]) for s in scored if named and s[3] == named[0]), None)
    return best[3], best[4], named_count


def _algorithm_text(algo: Algorithm, preset: str) -> str:
    """``PRESET.replace(field=value, ...)``: the reading in grpo_lab code."""
    base = _candidate(preset, algo)
    head = (f"deepseek_v32(beta={base.beta:g}, delta={base.offpolicy_mask_delta:g}, eps={base.eps_low:g})"
            if preset == "DeepSeek-V3.2" else preset)
    skip = {"name", "params"}
    changes = {f.name: getattr(algo, f.name) for f in dataclasses.fields(Algorithm)
               if f.name not in skip and getattr(algo, f.name) != getattr(base, f.name)}
    changes.update({k: v for k, v in algo.params.items() if base.params.get(k) != v})
    return head + (f".replace({', '.join(f'{k}={v!r}' for k, v in changes.items())})" if changes else "")


# ---------------------------------------------------------------------------------------------
# defaults, unknown keys, the reading
# ---------------------------------------------------------------------------------------------
def _coerce(given: dict, defaults: dict) -> dict:
    """Strings that are numbers become floats for the keys whose default is a number or None (YAML 1.1
    reads ``1e-6`` as text; TRL's and verl's parsers convert it)."""
    out = dict(given)
    for k, v in given.items():
        d = defaults.get(k, "")
        if isinstance(v, str) and k in defaults and (d is None or (isinstance(d, (int, float))
                                                                  and not isinstance(d, bool))):
            try:
                out[k] = float(v) if not v.strip().lstrip("-").isdigit() else int(v)
            except ValueError:
                pass
    return out


def _unknown_trl(given: dict) -> list:
    known = set(_D.TRL_DEFAULTS) | _D.TRL_OTHER_FIELDS | _D.TRL_SCRIPT_FIELDS
    renamed = {"torch_dtype": " (TRL 1.16's ModelConfig calls it dtype; its parser refuses torch_dtype)"}
    return [f"{k}{renamed.get(k) or did_you_mean(k, known)}" for k in given if k not in known]


def _migrate_verl(given: dict, notes: list) -> dict:
    """verl's own migration of the legacy reward keys (``migrate_legacy_reward_impl``)."""
    out = dict(given)
    if given.get("reward_model.reward_manager") is not None:
        out["reward.reward_manager.name"] = given["reward_model.reward_manager"]
        notes.append("legacy key reward_model.reward_manager read as reward.reward_manager.name (verl migrates it)")
    for k, v in given.items():
        if k.startswith("reward_model.reward_kwargs."):
            out["reward." + k[len("reward_model."):]] = v
    return out


def _unknown_verl(given: dict) -> list:
    known = set(_D.VERL_DEFAULTS) | _D.VERL_OTHER_KEYS
    out = []
    for k in given:
        if k == "defaults":  # Hydra's composition list (ppo_trainer.yaml's first key), not a setting
            continue
        if k.split(".", 1)[0] not in _D.VERL_SECTIONS:
            out.append(f"{k} (no such section; verl's are {', '.join(_D.VERL_SECTIONS)})")
        elif (k.startswith(_D.VERL_STRICT_SECTIONS) and k not in known
              and not k.startswith(_D.VERL_OPEN_PREFIXES)):
            out.append(f"{k}{did_you_mean(k, known)}")
    return out


def _finish(d: Draft, library: str, source: Optional[str], unknown: list, budget: dict, norm: dict) -> Reading:
    core = {k: v for k, v in d.fields.items() if k in Algorithm.__dataclass_fields__}
    params = {k: v for k, v in d.fields.items() if k not in core}
    try:
        algo = Algorithm(name=f"{library} config", **core, params=params)
    except ValueError as exc:
        raise ValueError(f"{_LABEL[library]}: its values form no valid grpo_lab Algorithm: {exc}") from None
    (verify_trl if library == "trl" else verify_verl)(algo, d, budget, norm)
    inexact = list(dict.fromkeys(d.inexact))
    preset, deps, named_count = _match(algo, d.named, budget["max_new_tokens"])
    return Reading(library, source, algo, not inexact, _PAPERS[preset][0], preset, tuple(deps + inexact),
                   tuple(inexact), tuple(d.notes), tuple(unknown), d.named, named_count, dict(budget))


def from_trl(config: Any) -> Reading:
    """Read a TRL 1.16.0 GRPO configuration back as the grpo_lab algorithm it computes.

    Args:
        config: a ``trl.GRPOConfig``, a dict of its fields, or the path (str / PathLike) of a YAML file of
            them (TRL's ``--config`` form). Fields left out take TRL 1.16.0's defaults
            (:data:`grpo_lab.export.library_defaults.TRL_DEFAULTS`): ``loss_type='dapo'``, ``beta=0``,
            ``scale_rewards='group'``, ``epsilon=0.2``, ...

    Returns:
        :class:`Reading`.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: invalid YAML, content that is not a mapping, a value of the wrong type or an unknown
            choice (``loss_type``, ``scale_rewards``, ``importance_sampling_level``; with a did-you-mean).
    """
    given, source = trl_values(config)
    values = {**_D.TRL_DEFAULTS, **_coerce(given, _D.TRL_DEFAULTS)}
    d, budget, norm = read_trl(values)
    return _finish(d, "trl", source, _unknown_trl(given), budget, norm)


def from_verl(config: Any) -> Reading:
    """Read a verl 0.9.1 trainer configuration back as the grpo_lab algorithm it computes.

    Args:
        config: a nested dict (as ``ppo_trainer.yaml``) or a dict of dotted keys, a list of Hydra
            overrides ``key=value`` (what :func:`grpo_lab.export.translation.to_verl` returns; ``+`` / ``++`` allowed),
            or the path of a YAML file holding a mapping or such a list. Keys left out take verl 0.9.1's
            defaults (:data:`grpo_lab.export.library_defaults.VERL_DEFAULTS`): ``adv_estimator=gae``,
            ``loss_agg_mode=token-mean``, ``clip_ratio_c=3``, ``use_kl_loss=False``, ...

    Returns:
        :class:`Reading`.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: invalid YAML, content that is neither a mapping nor a list of overrides, a malformed
            override, a value of the wrong type or an unknown choice (with a did-you-mean).
    """
    given, source = verl_values(config)
    notes: list = []
    given = _migrate_verl(given, notes)
    values = {**_D.VERL_DEFAULTS, **_coerce(given, _D.VERL_DEFAULTS)}
    d, budget, norm = read_verl(values)
    d.notes[:0] = notes
    return _finish(d, "verl", source, _unknown_verl(given), budget, norm)


def guess_library(content: Any, label: str = "config") -> str:
    """``"trl"`` or ``"verl"`` from a configuration's keys (a list of overrides is verl's).

    Raises:
        ValueError: keys of both libraries, or of neither (the message names both and ``--library``).
    """
    if isinstance(content, (list, tuple)):
        return "verl"
    if not isinstance(content, dict):
        raise ValueError(f"{label} must be a mapping (TRL GRPOConfig fields, or verl's config sections) or a list of "
                         f"verl overrides, got {type(content).__name__}")
    keys = [str(k).lstrip("+") for k in content]
    verl = [k for k in keys if k.split(".", 1)[0] in _D.VERL_SECTIONS]
    trl = [k for k in keys if k in _D.TRL_DEFAULTS or k in _D.TRL_OTHER_FIELDS]
    if verl and trl:
        raise ValueError(f"{label} is ambiguous: it has TRL GRPOConfig fields ({', '.join(trl[:3])}) and verl "
                         f"sections ({', '.join(verl[:3])}); pass --library trl or --library verl")
    if not verl and not trl:
        raise ValueError(f"{label}: none of its keys is a TRL GRPOConfig field or a verl config section; pass "
                         "--library trl or --library verl")
    return "verl" if verl else "trl"


def check_config(path: Any, library: Optional[str] = None) -> Reading:
    """Read the configuration file ``path`` with :func:`from_trl` or :func:`from_verl`.

    Args:
        path: a YAML file (TRL: GRPOConfig fields; verl: a mapping or a list of overrides).
        library: ``"trl"``, ``"verl"``, or None to guess it from the keys (:func:`guess_library`).

    Raises:
        FileNotFoundError, ValueError: as :func:`from_trl` / :func:`from_verl`, an unknown ``library``
            (with a did-you-mean), or a library that cannot be guessed.
    """
    if library is not None and library not in LIBRARIES:
        raise ValueError(f"unknown library {library!r}{did_you_mean(library, LIBRARIES)}; expected one of {LIBRARIES}")
    library = library or guess_library(load_yaml(path), f"config file {str(path)!r}")
    return (from_trl if library == "trl" else from_verl)(path)
