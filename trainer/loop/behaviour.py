"""What an architecture does under the trainer, measured once on its tiny shape before anything starts.

The model's own config with its sizes shrunk (trainer.model.tiny), random weights, on the CPU, with the
attention implementation the run asks for; then:

- **attention**: the implementations its transformers class accepts; another one is refused naming
  --attn-implementation and the ones it takes;
- **document boundaries**: one packed row of two documents against each document alone. Equal logits:
  documents share rows. The second document's logits differ (its mask ignores the position ids, or a
  recurrent state carries over): one document per row. The first one's differ, or a document's logits change
  with padding after it (the model looks ahead): refused, it is no causal LM;
- **initialisation**: every tensor filled with NaN, then the trainer's own initialisation
  (trainer.model.build.initialise_unloaded), as after loading (every persistent tensor loaded) and, with
  --random-init, from nothing: a tensor left NaN, or an initialisation that raises, is refused naming it;
- **the step**: one trainer.loop.step.train_step on the packed row (the loss path the run uses, backward
  included): an error there is refused with the error.

The decision comes from what the model does, not from a list of names. `python -m trainer.loop.behaviour`
prints the table of docs/architectures.md: every causal-LM model type transformers registers, measured
from its default config. Imports torch and transformers (no ray, no datasets).
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from dataclasses import dataclass, field

import torch

from facts.errors import first_line
from trainer.loop.parallel import ONE_PROCESS
from trainer.loop.step import IGNORE_INDEX, model_inputs, takes_position_ids, train_step
from trainer.model import tiny as tiny_config
from trainer.model.build import initialise_unloaded
from trainer.model.errors import UnsupportedArchitecture
from trainer.model.parts import model_parts

log = logging.getLogger("trainer")
PACKED = "packed"              # several documents per row, each seeing only itself
ONE_PER_ROW = "one per row"    # documents would see each other in a row: each gets a row of its own
REFUSED = "refused"
ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
FLASH = ("flash_attention_2", "flash_attention_3")
LENGTHS = (7, 9)   # the two documents of the packed row
PADDING = 4        # padding after them, as the last row of a packed dataset has
TOLERANCE = 1e-4   # float32 on the CPU: equal logits agree to ~1e-6


@dataclass(frozen=True)
class Behaviour:
    """The measured verdict for one architecture and attention implementation."""

    model_type: str
    model_class: str
    attn_implementation: str
    packing: str                      # PACKED, ONE_PER_ROW or REFUSED
    reason: str = ""                  # what was measured, for ONE_PER_ROW and REFUSED
    problems: tuple[str, ...] = ()    # why it is refused, each naming the flag or input to change
    attention: tuple[str, ...] = ()   # the implementations its class accepts
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def one_per_row(self) -> str:
        """The reason documents are trained one per row, or "" when they share rows."""
        return self.reason if self.packing == ONE_PER_ROW else ""


class _Refused(Exception):
    """One reason the architecture cannot be trained, with the flag to change."""


def _model_class(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]


def _build(config, attn: str, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)


def _attention_refused(e: Exception) -> bool:
    return isinstance(e, ValueError) and "attn_implementation" in str(e)


def accepted_attention(config) -> tuple[str, ...]:
    """The attention implementations the architecture's transformers class declares (`_supports_sdpa`, ...)."""
    cls = _model_class(config)
    flags = (("sdpa", "_supports_sdpa"), ("eager", None), ("flex_attention", "_supports_flex_attn"),
             ("flash_attention_2", "_supports_flash_attn"), ("flash_attention_3", "_supports_flash_attn"))
    return tuple(attn for attn, flag in flags if flag is None or getattr(cls, flag, False))


def _attention(config, attn: str) -> tuple[tuple[str, ...], str]:
    """(the implementations it accepts, the one the measurement runs: flash is measured with sdpa on the CPU).

    The build itself decides (transformers refuses an implementation a model or one of its parts lacks); a build
    that fails for another reason (a package it needs) is refused with that reason."""
    accepted = accepted_attention(config)
    run = "sdpa" if attn in FLASH and "sdpa" in accepted else "eager" if attn in FLASH else attn
    try:
        _build(config, run, "meta")
        refused = attn not in accepted
    except Exception as e:  # transformers' own refusal, or a missing package
        if isinstance(e, ImportError):
            raise _Refused(f"--model: {_model_class(config).__name__} needs a package that is not installed "
                           f"({first_line(e)})") from None
        if not _attention_refused(e):
            raise
        refused = True
    if refused:
        accepted = tuple(a for a in accepted if a != run) or ("eager",)
        raise _Refused(f"--attn-implementation {attn}: transformers' {_model_class(config).__name__} does not support "
                       f"it (it supports {', '.join(accepted)}); pass --attn-implementation {accepted[0]}")
    return accepted, run


def _nan_filled(config, attn: str):
    """The model on the meta device, then allocated and every tensor NaN: what the trainer's build starts from."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.fill_(float("nan"))
    return model


def _unset(model) -> list[str]:
    return [n for n, t in [*model.named_parameters(), *model.named_buffers()]
            if t.is_floating_point() and bool(torch.isnan(t).any())]


def _initialised(config, attn: str, random_init: bool):
    """The trainer's own initialisation of the NaN-filled model (after a load: every persistent tensor loaded)."""
    reference = _build(config, attn)
    model = _nan_filled(config, attn)
    if not random_init:
        with torch.no_grad():
            state = reference.state_dict()
            for name, t in model.state_dict(keep_vars=True).items():
                t.copy_(state[name])
                t._is_hf_initialized = True
    name = type(model).__name__
    try:
        initialise_unloaded(model, seed=0)
    except Exception as e:  # noqa: BLE001 - whatever transformers' init raises, it would raise on every worker
        if random_init:
            raise _Refused(f"--random-init: transformers' initialisation of {name} fails ({first_line(e)}); "
                           f"train from a checkpoint of the model instead") from None
        raise _Refused(f"--model: transformers' initialisation of {name}'s tensors outside the checkpoint fails "
                       f"({first_line(e)})") from None
    unset = _unset(model)
    if unset and random_init:
        raise _Refused(f"--random-init: transformers' initialisation of {name} leaves {len(unset)} tensor(s) unset "
                       f"({', '.join(unset[:4])}); train from a checkpoint of the model instead")
    if unset:
        raise _Refused(f"--model: {len(unset)} tensor(s) of {name} are in no checkpoint and transformers' "
                       f"initialisation leaves them unset ({', '.join(unset[:4])})")
    return model.eval()


def _documents(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    low = min(3, vocab - 1)
    return [torch.randint(low, vocab, (n,), generator=g) for n in LENGTHS]


def _row(docs: list[torch.Tensor], pad_id: int, padding: int) -> dict[str, torch.Tensor]:
    """One packed row as trainer.data.packing lays it out: per-document position ids, labels shifted."""
    ids = torch.cat([*docs, torch.full((padding,), pad_id)])
    pos = torch.cat([torch.arange(len(d)) for d in docs] + [torch.arange(padding)])
    labels = torch.full_like(ids, IGNORE_INDEX)
    at = 0
    for d in docs:
        labels[at:at + len(d) - 1] = d[1:]
        at += len(d)
    return {"input_ids": ids[None], "position_ids": pos[None], "labels": labels[None]}


@torch.no_grad()
def _logits(model, row: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**model_inputs(model, row)).logits[0].float()


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = max(1.0, float(b.abs().max()))
    return float((a - b).abs().max()) / scale


def boundaries(model, vocab: int, pad_id: int) -> tuple[str, str]:
    """(PACKED / ONE_PER_ROW / REFUSED, what was measured): two documents in one row against each alone."""
    first, second = _documents(vocab)
    alone = [_logits(model, _row([d], pad_id, 0)) for d in (first, second)]
    padded = _logits(model, _row([second], pad_id, len(first) + PADDING))[:len(second)]
    packed = _logits(model, _row([first, second], pad_id, PADDING))
    ahead = max(_differ(packed[:len(first)], alone[0]), _differ(padded, alone[1]))
    if not torch.isfinite(packed).all():
        return REFUSED, "its logits on random weights are not finite"
    if ahead > TOLERANCE:
        return REFUSED, (f"it is not causal: a document's logits change with the tokens after it (by {ahead:.1e}); "
                         f"the trainer trains causal LMs")
    leak = _differ(packed[len(first):len(first) + len(second)], alone[1])
    if leak > TOLERANCE:
        why = "its forward takes no position ids" if not takes_position_ids(model) else \
            "its attention mask or state does not follow the per-document position ids"
        return ONE_PER_ROW, f"in a packed row the second document's logits differ from its own by {leak:.1e} ({why})"
    return PACKED, ""


def _step(model, row: dict[str, torch.Tensor]) -> None:
    """One training step of the trainer's own (its loss path, backward, clipping) on the packed row."""
    model.train()
    optimizer = _NoStep()
    try:
        out = train_step(model, optimizer, None, [row], device=torch.device("cpu"), collectives=ONE_PROCESS)
    except Exception as e:  # noqa: BLE001 - it would fail alike on every worker
        raise _Refused(f"--model: the training step fails for {type(model).__name__} "
                       f"({first_line(e)})") from None
    finally:
        model.eval()
    if not (torch.isfinite(out.loss) and torch.isfinite(out.grad_norm)):
        raise _Refused(f"--model: the training step gives a loss of {float(out.loss):.4g} and a gradient norm of "
                       f"{float(out.grad_norm):.4g} for {type(model).__name__} on random weights")


class _NoStep:
    """An optimizer that leaves the weights as they are (SGD with lr 0 would still write 0 x NaN)."""

    param_groups = [{"lr": 0.0}]

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def measure(config, *, attn_implementation: str = "sdpa", random_init: bool = False,
            keep: list | None = None) -> Behaviour:
    """The architecture's behaviour under the trainer, measured on its tiny shape (well under a second on a CPU).

    `keep`: the tiny model (random weights, its own initialisation) is appended to it, for more checks."""
    model_type = getattr(config, "model_type", "?")
    try:
        cls = _model_class(config).__name__
    except KeyError:
        cls = "?"
    accepted: tuple[str, ...] = ()
    notes: list[str] = []
    with _quiet():
        try:
            small = tiny_config.shrink(config)
            accepted = accepted_attention(small)
            accepted, attn = _attention(small, attn_implementation)
            if attn != attn_implementation:
                notes.append(f"document boundaries measured with {attn} on the CPU ({attn_implementation} needs "
                             f"a GPU); transformers derives both masks from the position ids")
            torch.manual_seed(0)
            model = _initialised(small, attn, random_init=False)
            if keep is not None:
                keep.append(model)
            if random_init:
                _initialised(small, attn, random_init=True)
            try:
                model_parts(model)
            except UnsupportedArchitecture as e:
                raise _Refused(f"--model: {e}") from None
            vocab = model.get_output_embeddings().weight.shape[0]
            pad = getattr(small, "pad_token_id", None)
            verdict, reason = boundaries(model, vocab, pad if isinstance(pad, int) and 0 <= pad < vocab else 0)
            if verdict == REFUSED:
                raise _Refused(f"--model: {cls} ({model_type}) cannot be trained: {reason}")
            _step(model, _row(_documents(vocab), 0, PADDING))
        except _Refused as e:
            return Behaviour(model_type, cls, attn_implementation, REFUSED, str(e), (str(e),), accepted,
                             tuple(notes))
        except Exception as e:  # noqa: BLE001 - the tiny shape does not build or run: the reason is stated
            reason = (f"--model: the pre-flight cannot build {cls} ({model_type}) small to measure its document "
                      f"boundaries ({first_line(e)[:200]})")
            return Behaviour(model_type, cls, attn_implementation, REFUSED, reason, (reason,), accepted, tuple(notes))
    return Behaviour(model_type, cls, attn_implementation, verdict, reason, (), accepted, tuple(notes))


class _quiet:
    """transformers' and torch's warnings about the tiny shape (untied heads, sliding windows) stay out of the log;
    one thread (a tiny model's ops are overhead: several threads on a busy machine made each forward 30x slower)."""

    def __enter__(self):
        from transformers.utils import logging as hf_logging

        self._level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")
        self._rng = torch.random.get_rng_state()
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        from transformers.utils import logging as hf_logging

        torch.set_num_threads(self._threads)
        torch.random.set_rng_state(self._rng)  # the run's own seeded draws are not moved by the measurement
        self._warnings.__exit__(*exc)
        hf_logging.set_verbosity(self._level)
        return False


_MEASURED: dict[tuple[str, str], Behaviour] = {}


def measured(config, attn_implementation: str) -> Behaviour:
    """measure(), once per config and attention implementation in this process."""
    key = (config.to_json_string(use_diff=False), attn_implementation)
    if key not in _MEASURED:
        _MEASURED[key] = measure(config, attn_implementation=attn_implementation)
    return _MEASURED[key]


def documents_per_row(config, attn_implementation: str) -> str:
    """The reason documents go one per row for this model, or "" when they share rows (what the workers pack by).

    Refusals are the pre-flight's to report: here a refused model packs one document per row.
    """
    found = measured(config, attn_implementation)
    return "" if found.packing == PACKED else (found.reason or found.packing)


# ---------------------------------------------------------------- every registered type: docs/architectures.md

def registered_types() -> list[str]:
    """Every model type transformers registers a causal-LM class for."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def default_config(model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type)


def survey(types: list[str] | None = None, keep: dict | None = None) -> dict[str, Behaviour]:
    """Each registered type measured from transformers' default config of it: with the default attention (sdpa),
    else with the first one its class accepts (the row says which flag that takes). `keep`: model type -> the
    tiny model of the last measurement."""
    out = {}
    for model_type in types if types is not None else registered_types():
        try:
            config = default_config(model_type)
        except Exception as e:  # noqa: BLE001 - its default config cannot be made: the reason is the row
            reason = f"transformers' default config does not build ({first_line(e)[:160]})"
            out[model_type] = Behaviour(model_type, "?", "sdpa", REFUSED, reason, (reason,))
            continue
        models: list = []
        found = measure(config, keep=models)
        other = [a for a in found.attention if a not in FLASH]
        if found.packing == REFUSED and found.reason.startswith("--attn-implementation") and other:
            found = measure(config, attn_implementation=other[0], keep=models)
        out[model_type] = found
        if keep is not None and models and found.packing != REFUSED:
            keep[model_type] = models[-1]
    return out


def _cell(text: str) -> str:
    """Table text: no magnitudes (they vary with the machine's float kernels), no pipes."""
    return re.sub(r" \(?by [0-9.]+e[-+][0-9]+\)?", "", text).replace("|", "\\|").replace("\n", " ")


def table(found: dict[str, Behaviour]) -> str:
    """The markdown table of docs/architectures.md."""
    lines = ["| `model_type` | class | packing | attention | why |", "|---|---|---|---|---|"]
    for model_type, b in sorted(found.items()):
        why = b.reason.removeprefix("--model: ") if b.packing != PACKED else ""
        if b.attn_implementation != "sdpa" and b.packing != REFUSED:
            why = f"with --attn-implementation {b.attn_implementation} (no sdpa)" + (f"; {why}" if why else "")
        lines.append(f"| `{model_type}` | {b.model_class} | {b.packing} | {', '.join(b.attention) or '-'} | "
                     f"{_cell(why)} |")
    return "\n".join(lines) + "\n"


def counts(found: dict[str, Behaviour]) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in found.values():
        out[b.packing] = out.get(b.packing, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table (every registered causal-LM type, measured now)."""
    found = survey(list(argv) if argv else None)
    sys.stdout.write(table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
