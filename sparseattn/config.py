"""TrainConfig: every training setting in one typed dataclass, filled as
    dataclass defaults  <-  preset for (task, model)  <-  --key=value flags.

Unknown keys are rejected with the list of valid ones. The defaults are the seed's copy-task
demo (1 layer, d_model 128, 1 head, d_ff 128, dropout 0.1, Noam schedule with factor 1 and 400
warmup steps, label smoothing 0.1, batches of 128 sentences); the copy preset keeps the model and
trains it with batches of 16 and no dropout. Extension point: a new task or model adds its
fields here (with defaults that leave the others unchanged) and its presets to PRESETS.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, fields
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass
class TrainConfig:
    # what to train, where to write it
    task: str = "copy"
    model: str = "transformer"
    out: str = "runs/run"
    seed: int = 0                  # model init, dropout, batch order
    # data (letter tasks): sizes and length distribution, generated from data_seed
    data_seed: int = 0
    num_train: int = 9000
    num_valid: int = 1000
    num_test: int = 1000
    seq_mean: float = 15.0
    seq_std: float = 3.0
    src_eos: bool = True           # end each source with EOS (checkpoints without this key: False)
    data_dir: str = ""             # chunking: holds conll2000/{train,test}.txt (""; ../shared/data if it exists);
                                   # multi30k: holds Multi30k-format files {train,val,test_2016_flickr}.{en,de}
    # chunking (task=chunking, models tagger and bilstm; see data/chunking.py)
    dev_fraction: float = 0.1      # seeded (data_seed) share of train.txt held out as the valid split
    min_freq: int = 2              # rarer training words map to <unk>
    word_dim: int = 100            # token features: lowercased word, POS, capitalization, char CNN
    pos_dim: int = 25
    caps_dim: int = 5
    use_chars: bool = True
    char_out: int = 50
    input_dropout: float = 0.2
    word_dropout: float = 0.05     # training words replaced by <unk> with this probability
    ffn: str = "linear"            # tagger feed-forward: "linear" or "conv" (width 3 within each sentence)
    window: int = 0                # tagger attention: 0 complete graph per sentence, r: |i - j| <= r
    rel_pos: int = 0               # tagger relative-position bias clip distance; 0: none
    lstm_hidden: int = 200         # bilstm units per direction
    lstm_layers: int = 1
    lstm_dropout: float = 0.3
    # data (multi30k): Multi30k-format files, joint BPE size, valid sentences decoded each epoch
    vocab_size: int = 8000
    valid_bleu_sentences: int = 200
    # schedule
    epochs: int = 4
    max_steps: int = 0             # stop (with a checkpoint) after this many steps in all; 0: no limit
    batch_size: int = 128          # sentences per batch (bucketed by length)
    max_tokens: int = 0            # > 0: batches by a token budget instead of batch_size sentences (multi30k:
                                   # source + target tokens; chunking: whole sentences, no padding)
    time_budget_min: float = 0.0   # > 0: stop after this many minutes of training (mid-epoch), then validate,
                                   # test and plot as at the end; a resume with a larger budget goes on
    eval_batch_size: int = 500
    # model
    num_layers: int = 1
    d_model: int = 128
    num_heads: int = 1
    d_ff: int = 128
    dropout: float = 0.1
    clamp: float = 5.0             # attention score clamp [-c, c] (the seed's); 0: exact softmax
    share_embeddings: bool = True  # when source and target vocabularies are equal
    tie_generator: bool = False
    backend: str = "auto"
    act_max_steps: int = 8         # Universal Transformer (model=ut)
    act_threshold: float = 0.99
    act_loss_weight: float = 0.01
    # optimisation
    label_smoothing: float = 0.1
    lr_factor: float = 1.0         # Noam: factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    warmup: int = 400
    beta1: float = 0.9
    beta2: float = 0.98
    adam_eps: float = 1e-9
    grad_clip: float = 1.0         # max gradient norm; 0: off
    ema_decay: float = 0.0         # > 0: validate, keep_best and test an exponential moving average of the
                                   # weights (per step; ema.py); checkpoint.pt holds both
    # evaluation and decoding
    beam: int = 1                  # 1: greedy
    alpha: float = 0.6             # length penalty ((5 + len) / 6) ** alpha
    max_len_a: float = 1.0         # decode at most a * source length + b tokens
    max_len_b: int = 10
    eval_decode: bool = True       # decode the validation split after each epoch
    keep_best: bool = True         # final test metrics/plots use the best validation epoch's weights
    # run
    checkpoint_every: int = 0      # steps between checkpoints (also at each epoch end); 0: epochs only
    log_every: int = 50            # steps between train records in metrics.jsonl
    progress: bool = True          # tqdm bars
    plots: bool = True             # write plots when training finishes
    threads: int = 1               # torch.set_num_threads (0: torch's default); 1 is fastest on a shared
                                   # 2-core machine, where oversubscribed OpenMP threads spin (~10x slower)
    device: str = "auto"           # auto: cuda if available, else cpu

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# (task, model) -> overrides of the defaults. Keys not listed fall back to "*" entries.
PRESETS: Dict[Tuple[str, str], dict] = {
    # the seed's demo model (1 layer, d_model 128, 1 head, d_ff 128); small batches and no dropout
    # reach 98% exact copies in 4 epochs where batches of 64-128 plateau near 85% (docs/RESULTS.md)
    ("copy", "transformer"): dict(batch_size=16, warmup=400, dropout=0.0, epochs=6),
    ("reverse", "transformer"): {},
    ("sort", "transformer"): dict(num_layers=2, num_heads=4, d_ff=512, epochs=10),
    ("*", "ut"): dict(num_heads=4, d_ff=512, epochs=10),
    # sort (docs/RESULTS.md): 8 heads, d_ff 1024 and exact softmax; the average of the weights (ema_decay) decodes
    # 99.74% of test tokens where the raw weights of the same run reach 99.54%. Its validation accuracy sits at
    # 99.97-99.98% from epoch 25 on, too flat to pick an epoch by, so the last average is the model (keep_best off)
    ("sort", "ut"): dict(num_heads=8, d_ff=1024, clamp=0.0, dropout=0.0, batch_size=16, warmup=300, epochs=40,
                         eval_decode=False, ema_decay=0.9998, keep_best=False),
    # CoNLL-2000 chunking (docs/RESULTS.md): Noam peak lr 0.32 * 128^-0.5 * 200^-0.5 = 2e-3 at step 200;
    # the tagger overfits with dropout 0.1 / input dropout 0.2 (valid loss rises from epoch 8), hence 0.2 / 0.3
    ("chunking", "tagger"): dict(num_layers=2, num_heads=4, d_ff=256, ffn="conv", window=4, rel_pos=8, clamp=0.0,
                                 dropout=0.2, input_dropout=0.3, label_smoothing=0.0, lr_factor=0.32, warmup=200, grad_clip=5.0, epochs=5,
                                 max_tokens=800),
    ("chunking", "bilstm"): dict(label_smoothing=0.0, lr_factor=0.32, warmup=200, grad_clip=5.0, epochs=4,
                                 max_tokens=800),
    # sized for a CPU run: 7.6M parameters with the 8000-token joint BPE, embeddings shared and tied
    ("multi30k", "transformer"): dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1, clamp=0.0,
                                      share_embeddings=True, tie_generator=True, max_tokens=4096, warmup=800,
                                      epochs=10, beam=5, alpha=0.6, max_len_a=1.5, max_len_b=10, eval_batch_size=200,
                                      checkpoint_every=200),
}


def preset(task: str, model: str) -> dict:
    """The preset overrides for this task and model (empty when none is defined)."""
    return dict(PRESETS.get((task, model), PRESETS.get(("*", model), {})))


def _convert(name: str, typ: type, text: str):
    try:
        if typ is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return typ(text)
    except ValueError:
        raise ValueError(f"--{name} expects {typ.__name__}, got {text!r}") from None


def parse_overrides(args: Sequence[str], config_cls: type = TrainConfig) -> Dict[str, object]:
    """`--key=value` / `--key value` (and `--flag` for booleans) -> {key: typed value} for the
    fields of `config_cls` (a dataclass); raises ValueError naming an unknown key and the valid ones."""
    hints = typing.get_type_hints(config_cls)
    types = {f.name: hints[f.name] for f in fields(config_cls)}
    out: Dict[str, object] = {}
    i = 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ValueError(f"expected --key=value, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in types:
            raise ValueError(f"unknown config key {key!r}; valid keys: {', '.join(types)}")
        if not eq:
            if types[key] is bool and (i + 1 == len(args) or args[i + 1].startswith("--")):
                value = "true"
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise ValueError(f"--{key} needs a value")
        out[key] = _convert(key, types[key], value)
        i += 1
    return out


def config_from_checkpoint(saved: dict, overrides: Optional[Dict[str, object]] = None) -> TrainConfig:
    """The TrainConfig saved in a checkpoint; keys added since default to their old behaviour,
    renamed keys are read under their new names."""
    saved = {RENAMED.get(k, k): v for k, v in saved.items()}
    return TrainConfig(**{**BACKWARD_DEFAULTS, **saved, **(overrides or {})})


RENAMED: Dict[str, str] = {"batch_tokens": "max_tokens"}  # old key -> new key


# values of keys added after a checkpoint was written that reproduce how it was trained
BACKWARD_DEFAULTS: Dict[str, object] = {"src_eos": False}


def make_config(overrides: Dict[str, object]) -> TrainConfig:
    """Defaults <- preset(task, model) <- overrides."""
    base = TrainConfig()
    task = str(overrides.get("task", base.task))
    model = str(overrides.get("model", base.model))
    values = {**preset(task, model), **overrides}
    return dataclasses.replace(base, **values)


def describe() -> List[str]:
    return [f"  --{f.name}={f.default!r}" for f in fields(TrainConfig)]
