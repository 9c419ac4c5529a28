"""Typed configuration of a run: `Config` = task and model names + three dataclasses,

    run    RunConfig: schedule, optimiser, evaluation, checkpoints, device (every task)
    task   the task's own dataclass, registered with it (`register_task(name, config=...)`)
    model  the model's own dataclass, registered with it (`register_model(name, config=...)`)

filled as dataclass defaults <- preset file <- `--key=value` flags. Each key lives in exactly one
of the three, so flags stay flat (`--epochs=8 --d_model=64 --vocab_size=4000`); unknown keys are
errors naming the valid ones. Every field carries its help text (`cfg_field(default, "help")`),
which `sparseattn train --help` prints with its type and default.

Presets are TOML files shipped inside the package (`sparseattn/train/presets/<task>-<model>.toml`,
read with `importlib.resources`, so a wheel has them too; `sparseattn configs` lists them). The
preset of the run's task and model applies by default; `--config NAME` picks a shipped preset by
name (`sort-ut`), `--config FILE` any file. A named preset that does not exist is an error naming
the ones that do:

    [task]
    name = "sort"
    [run]
    epochs = 40
    [model]
    name = "ut"
    clamp = "none"
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
import typing
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:  # pragma: no cover
        from importlib.abc import Traversable

PRESETS = "presets"  # the folder of preset TOML files inside this package (sparseattn/train/presets)
Clamp = Optional[Tuple[float, float]]


def cfg_field(default: Any, help: str, *, check: Optional[Callable[[Any], Optional[str]]] = None) -> Any:
    """A dataclass field with help text and an optional check returning what is wrong, or None."""
    return field(default=default, metadata={"help": help, "check": check})


def at_least(lo: float) -> Callable[[Any], Optional[str]]:
    return lambda v: None if v >= lo else f"must be >= {lo:g}"


def finite_at_least(lo: float) -> Callable[[Any], Optional[str]]:
    return lambda v: None if lo <= v < math.inf else f"must be a finite number >= {lo:g}"


def device_name(v: str) -> Optional[str]:
    """cpu, cuda, cuda:N or auto: the devices training and decoding run on."""
    if v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()):
        return None
    return "must be cpu, cuda, cuda:N or auto (training and decoding run on a CPU or a CUDA GPU)"


def in_range(lo: float, hi: float, *, hi_open: bool = False) -> Callable[[Any], Optional[str]]:
    def check(v):
        ok = lo <= v < hi if hi_open else lo <= v <= hi
        return None if ok else f"must be in [{lo:g}, {hi:g}{')' if hi_open else ']'}"

    return check


def one_of(*choices: str) -> Callable[[Any], Optional[str]]:
    return lambda v: None if v in choices else f"must be one of {', '.join(map(repr, choices))}"


def seed_value(v: int) -> Optional[str]:
    """Seeds feed torch, numpy and random: a non-negative int below 2**63."""
    return None if 0 <= v < 2**63 else "must be an int in [0, 2**63)"


# Decoding costs grow with the beam (its (beam, vocabulary) scores per sentence) and with the square of
# the output length (each step attends to every earlier token): limits far above any real setting
# that turn a typo into a message instead of a process killed for memory or running for hours.
MAX_BEAM = 1024
MAX_LEN_A = 16.0
MAX_LEN_B = 4096


@dataclass
class RunConfig:
    """Settings of the training loop, shared by every task and model."""

    out: str = cfg_field("", "run directory: config.json, metrics.jsonl, checkpoint.pt, best.pt, results.json, plots/")
    seed: int = cfg_field(0, "seed of the model's init, dropout and batch order", check=seed_value)
    epochs: int = cfg_field(4, "training epochs", check=at_least(0))
    max_steps: int = cfg_field(
        0, "stop (with a checkpoint) after this many steps in all; 0: no limit", check=at_least(0)
    )
    batch_size: int = cfg_field(128, "sentences per batch (bucketed by length) when max_tokens is 0", check=at_least(1))
    max_tokens: int = cfg_field(0, "> 0: batches by a token budget instead of batch_size sentences", check=at_least(0))
    time_budget_min: float = cfg_field(
        0.0,
        "> 0: stop after this many minutes of training (mid-epoch), then "
        "validate, test and plot; a resume with a larger budget goes on",
        check=at_least(0),
    )
    eval_batch_size: int = cfg_field(500, "sentences per batch when decoding", check=at_least(1))
    label_smoothing: float = cfg_field(0.1, "label smoothing of the cross entropy", check=in_range(0, 1, hi_open=True))
    lr_factor: float = cfg_field(
        1.0,
        "Noam: lr = factor * lr_dim^-0.5 * min(step^-0.5, step * warmup^-1.5)",
        check=lambda v: None if 0 < v < math.inf else "must be a finite number > 0",
    )
    lr_dim: int = cfg_field(0, "the d in Noam's d^-0.5; 0: the model's d_model", check=at_least(0))
    warmup: int = cfg_field(400, "Noam warm-up steps", check=at_least(1))
    beta1: float = cfg_field(0.9, "Adam beta1", check=in_range(0, 1, hi_open=True))
    beta2: float = cfg_field(0.98, "Adam beta2", check=in_range(0, 1, hi_open=True))
    adam_eps: float = cfg_field(1e-9, "Adam epsilon", check=lambda v: None if 0 < v < 1 else "must be in (0, 1)")
    grad_clip: float = cfg_field(1.0, "max gradient norm; 0: off", check=at_least(0))
    ema_decay: float = cfg_field(
        0.0,
        "> 0: validate, keep and test a moving average of the weights over about 1/(1 - decay) steps",
        check=in_range(0, 1, hi_open=True),
    )
    beam: int = cfg_field(1, f"beam size when decoding; 1: greedy (at most {MAX_BEAM})", check=in_range(1, MAX_BEAM))
    alpha: float = cfg_field(0.6, "length penalty ((5 + len) / 6) ** alpha of beam search", check=at_least(0))
    max_len_a: float = cfg_field(
        1.0, "decode at most max_len_a * source length + max_len_b tokens", check=in_range(0, MAX_LEN_A)
    )
    max_len_b: int = cfg_field(10, "see max_len_a", check=in_range(0, MAX_LEN_B))
    eval_decode: bool = cfg_field(True, "decode the validation split after each epoch")
    keep_best: bool = cfg_field(True, "test and plot the best validation epoch's weights (best.pt)")
    checkpoint_every: int = cfg_field(
        0, "steps between checkpoints (also at each epoch end); 0: epochs only", check=at_least(0)
    )
    log_every: int = cfg_field(50, "steps between train records in metrics.jsonl", check=at_least(1))
    progress: bool = cfg_field(True, "show progress bars")
    plots: bool = cfg_field(True, "write plots when training finishes")
    threads: int = cfg_field(
        1, "torch threads (0: torch's default); 1 is fastest on a shared 2-core machine", check=at_least(0)
    )
    device: str = cfg_field("auto", "cpu, cuda, cuda:N, or auto (cuda when available)", check=device_name)


@dataclass
class Config:
    """A run's whole configuration: task and model names and their three sections."""

    task: str
    model: str
    run: RunConfig
    task_cfg: Any
    model_cfg: Any

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "model": self.model,
            "run": dataclasses.asdict(self.run),
            "task_config": dataclasses.asdict(self.task_cfg),
            "model_config": dataclasses.asdict(self.model_cfg),
        }

    def sections(self) -> Dict[str, Any]:
        return {"run": self.run, "task": self.task_cfg, "model": self.model_cfg}


TASK_CONFIGS: Dict[str, type] = {}  # filled by register_task
MODEL_CONFIGS: Dict[str, type] = {}  # filled by register_model
DEFAULT_MODELS: Dict[str, str] = {}  # task -> the model `--model` defaults to


def _lookup(registry: Dict[str, type], kind: str, name: str) -> type:
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; registered: {', '.join(sorted(registry))}")
    return registry[name]


def _types(cls: type) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def convert(key: str, typ: Any, value: Any) -> Any:
    """A flag's text or a TOML value -> the field's type; ValueError naming the key otherwise."""
    if typ == Clamp:
        return parse_clamp(key, value)
    text = value if isinstance(value, str) else None
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            low = str(value).lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
            raise ValueError
        out = typ(value)
    except (TypeError, ValueError):
        raise ValueError(f"--{key} expects {getattr(typ, '__name__', typ)}, got {value!r}") from None
    if typ is float and math.isnan(out):
        raise ValueError(f"--{key} must be a number, got {text or value!r}")
    return out


def parse_clamp(key: str, value: Any) -> Clamp:
    """ "none" / None -> None (exact softmax); "lo,hi", [lo, hi] -> (lo, hi); one number c -> (-c, c)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "exact")):
        return None
    try:
        if isinstance(value, str):
            parts = [float(p) for p in value.split(",")]
        elif isinstance(value, (list, tuple)):
            parts = [float(p) for p in value]
        else:
            parts = [float(value)]
    except (TypeError, ValueError):
        raise ValueError(f"--{key} expects 'none' or 'lo,hi', got {value!r}") from None
    if len(parts) == 1:
        if parts[0] == 0:
            raise ValueError(
                f"--{key}=0 would clamp every score to 0 (it once meant exact softmax: write --{key}=none)"
            )
        parts = [-abs(parts[0]), abs(parts[0])]
    if len(parts) != 2 or any(not math.isfinite(p) for p in parts) or parts[0] > parts[1]:
        raise ValueError(f"--{key} expects 'none' or finite 'lo,hi' with lo <= hi, got {value!r}")
    return parts[0], parts[1]


def check(cfg: Config) -> None:
    """Run every field's check; ValueError naming the first bad key."""
    for section in cfg.sections().values():
        for f in fields(section):
            test = f.metadata.get("check")
            problem = test(getattr(section, f.name)) if test else None
            if problem:
                raise ValueError(f"--{f.name}={getattr(section, f.name)!r}: {problem}")
    post = getattr(cfg.model_cfg, "validate", None)
    if post:
        post(cfg)


def check_run_values(values: Dict[str, Any]) -> None:
    """Convert and check some run keys given outside a config (evaluate's and translate's
    --beam, --max_len_a, ...) as `build_config` checks them; ValueError naming the first bad one."""
    types, checks = _types(RunConfig), {f.name: f.metadata.get("check") for f in fields(RunConfig)}
    for key, value in values.items():
        value = convert(key, types[key], value)
        problem = checks[key](value) if checks[key] else None
        if problem:
            raise ValueError(f"--{key}={value!r}: {problem}")


def parse_flags(args: Sequence[str]) -> Dict[str, str]:
    """`--key=value` / `--key value` / `--flag` -> {key: text} (booleans given bare get "true")."""
    out: Dict[str, str] = {}
    args = list(args)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"expected --key=value, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
                value = args[i]
            else:
                value = "true"
        out[key] = value
        i += 1
    return out


def presets_dir() -> Traversable:
    """The folder of the shipped presets, inside the installed package."""
    return resources.files(__package__ or "sparseattn.train").joinpath(PRESETS)


def preset_files() -> Dict[str, Traversable]:
    """name (`copy-transformer`) -> file of every shipped preset, sorted by name. An install without
    them (package data left out of a wheel) is an error rather than a run on the defaults."""
    folder = presets_dir()
    found = (
        {entry.name[: -len(".toml")]: entry for entry in folder.iterdir() if entry.name.endswith(".toml")}
        if folder.is_dir()
        else {}
    )
    if not found:
        raise FileNotFoundError(
            f"no presets in {folder}: this install of sparseattn lacks its package data; reinstall sparseattn"
        )
    return dict(sorted(found.items()))


def preset_file(name: str) -> Traversable:
    """The shipped preset `name` (`sort-ut` or `sort-ut.toml`); ValueError naming the presets if none."""
    files = preset_files()
    key = name[: -len(".toml")] if name.endswith(".toml") else name
    if key not in files:
        raise ValueError(f"no preset {name!r}; presets: {', '.join(files)}")
    return files[key]


def preset_path(task: str, model: str) -> Optional[Traversable]:
    """The shipped preset of this task and model (`<task>-<model>.toml`), or None if it has none."""
    return preset_files().get(f"{task}-{model}")


def config_source(spec: Union[str, os.PathLike]) -> Union[Path, Traversable]:
    """What `--config SPEC` reads: the file SPEC if there is one, else the shipped preset named SPEC
    (`sort-ut`); neither is one FileNotFoundError naming the presets."""
    path = Path(spec)
    if path.exists():
        return path
    try:
        files = preset_files()
    except FileNotFoundError:  # the missing file is the error to report
        files = {}
    key = path.name[: -len(".toml")] if path.name.endswith(".toml") else path.name
    if key in files and str(spec) in (key, path.name):  # a bare name, not a path to a missing file
        return files[key]
    raise FileNotFoundError(
        f"--config {spec}: no such file, nor a preset of that name (presets: {', '.join(files) or 'none'})"
    )


def read_toml(path: Union[str, os.PathLike, Traversable]) -> Dict[str, Any]:
    """{"task"?, "model"?, and key -> value} of a preset: a file, a shipped preset's name (see
    `config_source`) or a preset's Traversable. The sections [run], [task] and [model] flattened,
    the `name` of [task] and [model] as "task" and "model"."""
    source = config_source(path) if isinstance(path, (str, os.PathLike)) else path
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"--config {path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--config {path}: not valid TOML ({e})") from None
    flat: Dict[str, Any] = {}
    for key, value in data.items():
        if key not in ("run", "task", "model") or not isinstance(value, dict):
            raise ValueError(f"--config {path}: unexpected entry {key!r} (keys go in [run], [task] or [model])")
        for k, v in value.items():
            flat[key if k == "name" and key != "run" else k] = v
    return flat


def build_config(task: str, model: str, values: Dict[str, Any]) -> Config:
    """Defaults of the three sections with `values` (flag texts or TOML values) applied."""
    sections = {
        "run": RunConfig,
        "task": _lookup(TASK_CONFIGS, "task", task),
        "model": _lookup(MODEL_CONFIGS, "model", model),
    }
    owner = {key: name for name, cls in sections.items() for key in _types(cls)}
    per: Dict[str, Dict[str, Any]] = {name: {} for name in sections}
    for key, value in values.items():
        if key not in owner:
            close = difflib.get_close_matches(key, list(owner), n=3)
            hint = (
                f"did you mean {' or '.join('--' + k for k in close)}? (`sparseattn train --help --task {task} "
                f"--model {model}` lists every key)"
                if close
                else f"valid keys: {', '.join(sorted(owner))}"
            )
            raise ValueError(f"unknown config key {key!r} for task {task!r} and model {model!r}; {hint}")
        cls = sections[owner[key]]
        per[owner[key]][key] = convert(key, _types(cls)[key], value)
    cfg = Config(task, model, *(sections[name](**per[name]) for name in ("run", "task", "model")))
    check(cfg)
    return cfg


def make_config(flags: Dict[str, Any], config_file: Optional[str] = None) -> Config:
    """Defaults <- preset (`config_file`: a file or a shipped preset's name; else the shipped
    `<task>-<model>` preset if there is one) <- flags."""
    flags = dict(flags)
    from_file = read_toml(config_file) if config_file else {}
    task = str(flags.pop("task", from_file.pop("task", "copy")))
    model = str(flags.pop("model", from_file.pop("model", DEFAULT_MODELS.get(task, "transformer"))))
    if not config_file:
        path = preset_path(task, model)
        if path is not None:
            from_file = {k: v for k, v in read_toml(path).items() if k not in ("task", "model")}
    return build_config(task, model, {**from_file, **flags})


def config_from_dict(saved: Dict[str, Any], source: Optional[Path] = None) -> Config:
    """The Config a checkpoint or config.json holds. Older checkpoints kept one flat dict of every
    key (clamp as one number c, 0 meaning exact): it is split into the sections here. With `source`
    (the file it came from), anything wrong is one ValueError naming the file."""
    if source is None:
        return _config_from_dict(saved)
    try:
        return _config_from_dict(saved)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, KeyError):
            reason = f"no {reason} entry"
        raise ValueError(f"{source} holds no valid config ({reason})") from None


def _config_from_dict(saved: Dict[str, Any]) -> Config:
    if not isinstance(saved, dict):
        raise TypeError(f"a dict is expected, got {type(saved).__name__}")
    if "run" in saved:
        values = {**saved["run"], **saved["task_config"], **saved["model_config"]}
        return build_config(saved["task"], saved["model"], values)
    flat = dict(saved)
    task, model = flat.pop("task"), flat.pop("model")
    if "clamp" in flat:
        flat["clamp"] = None if not flat["clamp"] else (-float(flat["clamp"]), float(flat["clamp"]))
    if model == "bilstm":
        flat.setdefault("lr_dim", flat.get("d_model", 128))  # the flat config's d_model scaled Noam's lr
    known = set(_types(RunConfig)) | set(_types(TASK_CONFIGS[task])) | set(_types(MODEL_CONFIGS[model]))
    return build_config(task, model, {k: v for k, v in flat.items() if k in known})


def with_overrides(cfg: Config, values: Dict[str, Any]) -> Config:
    """cfg with some keys changed (flag texts or values), checked again."""
    merged = {**dataclasses.asdict(cfg.run), **dataclasses.asdict(cfg.task_cfg), **dataclasses.asdict(cfg.model_cfg)}
    return build_config(cfg.task, cfg.model, {**merged, **values})


def describe(task: str, model: str) -> List[str]:
    """Help lines of every key for this task and model: name, type, default and help, by section."""
    lines = []
    for title, cls in (
        ("run", RunConfig),
        (f"task {task}", _lookup(TASK_CONFIGS, "task", task)),
        (f"model {model}", _lookup(MODEL_CONFIGS, "model", model)),
    ):
        lines.append(f"{title} ({cls.__name__}):")
        types = _types(cls)
        for f in fields(cls):
            typ = "clamp" if types[f.name] == Clamp else getattr(types[f.name], "__name__", str(types[f.name]))
            default = "none" if f.default is None else f.default
            lines.append(f"  --{f.name}={default!s:<10} {typ:<6} {f.metadata.get('help', '')}")
    return lines


def list_presets() -> List[Tuple[str, str]]:
    """(file name, first comment line) of each shipped preset."""
    out = []
    for name, file in preset_files().items():
        first = next(
            (
                line.lstrip("# ").strip()
                for line in file.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")
            ),
            "",
        )
        out.append((f"{name}.toml", first))
    return out
