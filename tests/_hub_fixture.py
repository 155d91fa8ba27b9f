"""Small stand-ins, built offline in a temporary directory, for what a GPU run downloads from the hub.

* :func:`write_tiny_instruct_model`: a model directory in the layout of a small instruct model such
  as ``Qwen/Qwen2.5-0.5B-Instruct``: ``config.json`` and ``model.safetensors`` of a
  ``Qwen2ForCausalLM`` (2 layers, hidden size 32, random weights), ``generation_config.json`` with
  the two stop ids and the sampling settings Qwen2.5-Instruct ships, and a tokenizer of the same
  type as Qwen2.5's: a byte-level BPE ``Qwen2Tokenizer`` (``tokenizer.json``,
  ``tokenizer_config.json``) trained here with the ``tokenizers`` library on a few hundred lines,
  with Qwen's special tokens ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (EOS) and a
  ChatML chat template (``chat_template.jinja``) written for these tests in the form of Qwen2.5's
  (a default system turn when the conversation has none). ``bos=True`` gives a variant whose
  tokenizer adds a BOS token, as Llama 3's does, and whose template writes it too.
* :func:`write_gsm8k_hub_dir`: a dataset directory laid out as the hub repository ``openai/gsm8k``:
  ``main/train-00000-of-00001.parquet``, ``main/test-00000-of-00001.parquet`` and a ``README.md``
  whose YAML header declares the config ``main`` and its splits (the header the hub repository
  has; without it ``datasets`` 5 sees only a config ``default``), so that
  ``datasets.load_dataset(directory, "main", split="train")`` reads it offline exactly as it reads
  ``"openai/gsm8k"``.

Nothing here touches the network. The weights are float32 (Qwen2.5 ships bfloat16) so that CPU
tests run in the default dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Qwen2.5's special tokens, in the order of their ids here (0, 1, 2).
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: The BOS token of the ``bos=True`` variant (Llama 3's name for it).
BOS = "<|begin_of_text|>"

#: A ChatML template in the form of Qwen2.5-Instruct's, without its tool-calling branches.
CHATML_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Ema", "Felix", "Grace", "Hugo", "Iris", "Jonas"]
_THINGS = ["apples", "books", "marbles", "stickers", "cookies", "pencils", "coins", "shells"]


def training_lines() -> list[str]:
    """A few hundred lines of text to train the BPE on: the shipped GSM8K fixture's questions and
    answers, word problems made from templates, and ChatML-formatted turns. Deterministic."""
    from grpo_lab.tasks.gsm8k import load_fixture

    lines = []
    for row in load_fixture():
        lines.append(row["question"])
        lines.extend(row["answer"].splitlines())
    for i in range(240):
        name, thing = _NAMES[i % len(_NAMES)], _THINGS[(i * 3) % len(_THINGS)]
        a, b = 3 + (7 * i) % 90, 2 + (5 * i) % 40
        lines.append(f"{name} has {a} {thing} and buys {b} more. How many {thing} does {name} have now?")
        lines.append(f"{name} has {a}+{b}=<<{a}+{b}={a + b}>>{a + b} {thing}, so the answer is \\boxed{{{a + b}}}.")
    for i in range(20):
        lines.append(f"{IM_START}user\nWhat is {i} times {i + 2}?{IM_END}\n{IM_START}assistant\n"
                     f"{i} * {i + 2} = {i * (i + 2)}. The answer is \\boxed{{{i * (i + 2)}}}.{IM_END}")
    return lines


def build_qwen_tokenizer(*, bos: bool = False, vocab_size: int = 1000):
    """A ``transformers.Qwen2Tokenizer`` (Qwen2.5's tokenizer class: byte-level BPE, NFC, Qwen's
    split regex with single digits) trained on :func:`training_lines`.

    Args:
        bos: also a BOS token ``<|begin_of_text|>`` that encoding adds (``add_bos_token=True``) and
            the chat template writes, like Llama 3's tokenizer (Qwen2.5 has none).
        vocab_size: the most tokens the BPE may learn (fewer when the text has fewer merges).

    Returns:
        the tokenizer, with ``eos_token="<|im_end|>"``, ``pad_token="<|endoftext|>"`` and
        :data:`CHATML_TEMPLATE` (prefixed with ``{{ bos_token }}`` when ``bos``).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    specials = [ENDOFTEXT, IM_START, IM_END]
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(training_lines(), trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    extra = dict(bos_token=BOS, add_bos_token=True) if bos else {}
    return Qwen2Tokenizer(vocab=model["vocab"], merges=merges, eos_token=IM_END, pad_token=ENDOFTEXT,
                          unk_token=None, extra_special_tokens=[IM_START, IM_END], model_max_length=32768,
                          chat_template=("{{- bos_token }}" if bos else "") + CHATML_TEMPLATE, **extra)


def write_tiny_instruct_model(directory: str | Path, *, bos: bool = False, seed: int = 0) -> Path:
    """Write a tiny random ``Qwen2ForCausalLM`` with a Qwen2.5-type tokenizer into ``directory``,
    in the hub layout (see the module docstring).

    Args:
        directory: created if needed.
        bos: the BOS variant of :func:`build_qwen_tokenizer`.
        seed: torch seed of the random weights (the global generator is left as it was).

    Returns:
        ``Path(directory)``, loadable with ``grpo_lab.policy.models.load_policy``.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    directory = Path(directory)
    tokenizer = build_qwen_tokenizer(bos=bos)
    eot, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id if bos else eot,
                         eos_token_id=im_end, pad_token_id=eot)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    # What Qwen2.5-Instruct's generation_config.json holds: both stop ids and its sampling settings.
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=[im_end, eot],
                                               pad_token_id=eot, do_sample=True, temperature=0.7, top_p=0.8,
                                               top_k=20, repetition_penalty=1.05)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


#: The YAML header of the hub repository's README.md for the config ``main`` (the repository
#: declares ``socratic`` the same way); ``datasets`` reads the configs and splits from it.
_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
A stand-in for openai/gsm8k written by grpo_lab's tests (problems from data/tasks/gsm8k_fixture.jsonl).
"""


def write_gsm8k_hub_dir(directory: str | Path, train: list[dict] | None = None,
                        test: list[dict] | None = None) -> Path:
    """Write GSM8K-schema problems into ``directory`` in the layout of the hub repository
    ``openai/gsm8k`` (see the module docstring), with pandas and pyarrow.

    Args:
        directory: created if needed.
        train, test: ``{"question": str, "answer": str}`` rows; default: the shipped fixture split
            as ``GSM8KTask(source="fixture")`` splits it (the first 16 rows train, the last 8 test).

    Returns:
        ``Path(directory)``.
    """
    import pandas as pd

    from grpo_lab.tasks.gsm8k import load_fixture

    rows = load_fixture()
    train = rows[:16] if train is None else train
    test = rows[16:] if test is None else test
    directory = Path(directory)
    (directory / "main").mkdir(parents=True, exist_ok=True)
    for split, part in (("train", train), ("test", test)):
        frame = pd.DataFrame(part, columns=["question", "answer"])
        frame.to_parquet(directory / "main" / f"{split}-00000-of-00001.parquet", index=False)
    (directory / "README.md").write_text(_README, encoding="utf-8")
    return directory
