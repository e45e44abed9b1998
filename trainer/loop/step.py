"""One optimizer step: micro-batches with gradient accumulation, loss on response tokens only.

The loss of a step is the mean over every response token of the *global* batch, not a
mean of per-micro-batch means: each micro-batch contributes sum(token losses) x
world_size / global_response_tokens, and FSDP's gradient reduction averages over ranks.
That makes a step with 1 worker x 4 micro-batches equal to 2 workers x 2 micro-batches.

Packed rows carry position ids that restart at 0 for every document and no attention
mask; transformers then derives a block-diagonal causal mask from the position ids
(sdpa/eager/flex) or uses variable-length kernels (flash attention), so attention never
crosses documents; a model for which that does not hold (measured before Ray,
trainer.loop.behaviour) gets one document per row. A forward without position ids (a
state-space model's) is called without them. Labels arrive already shifted (labels[t] is the target of token t).

The loss never materialises fp32 logits for the whole micro-batch (trainer.model.losses), and
it is the model's own: its transform of the logits after the head (softcapping, scaling)
is applied by the loss instead of by the model, checked once against the model's own
logits (check_loss_path, which falls back to the plain loss for a transform it does not
know), and a mixture-of-experts model's router auxiliary loss is added as transformers
adds it (router_aux_loss_coef x aux_loss, when the config asks for router logits).

Imports only torch: the benchmark runs this exact step without ray or datasets.
"""

from __future__ import annotations

import inspect
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

import torch
import torch.nn.functional as F

from facts.errors import UserError
from trainer.config.flags import TrainConfig
from trainer.loop.parallel import Collectives
from trainer.model.losses import IMPLEMENTATIONS, liger_available, liger_has_softcap, linear_cross_entropy_sum

log = logging.getLogger("trainer")
IGNORE_INDEX = -100
LOSSES = ("auto",) + IMPLEMENTATIONS
DEFAULT_LOSS = "auto"  # the step's loss, and the one the micro-batch probe runs (trainer.loop.memory): the same memory


@dataclass
class StepOutput:
    loss: torch.Tensor          # mean loss per response token over the global batch (0-dim, on device)
    grad_norm: torch.Tensor     # global gradient norm before clipping (0-dim, on device)
    lr: float
    real_tokens: int            # non-padding tokens this rank processed
    loss_tokens: int            # response tokens this rank processed
    aux_loss: torch.Tensor | None = None  # router auxiliary loss (weighted, mean over micro-batches), in `loss`
    global_loss_tokens: torch.Tensor | None = None  # response tokens of the whole global batch (device)


def to_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def resolve_loss(loss: str, device: torch.device) -> str:
    """`auto`: Liger's fused kernel on a GPU when installed, else the chunked loss (same numbers)."""
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: use one of {', '.join(LOSSES)}")
    if loss == "auto":
        return "liger" if device.type == "cuda" and liger_available() else "chunked"
    if loss == "liger" and (device.type != "cuda" or not liger_available()):
        raise ValueError(f"loss 'liger' needs a CUDA device and the liger-kernel package (device {device}, "
                         f"liger installed: {liger_available()}); use 'chunked' (the same numbers, torch only)")
    return loss


@dataclass(frozen=True)
class HeadTransform:
    """What the model does to its logits after the head: logits * scale, then softcap * tanh(x / softcap)."""

    scale: float = 1.0
    softcap: float | None = None


# (holder, attribute, neutral value): the post-head transforms transformers' causal LMs read at forward time.
_POST_HEAD = (("config", "final_logit_softcapping", None),   # Gemma 2/3: softcap * tanh(logits / softcap)
              ("config", "logits_scaling", 1.0),             # Granite: logits / logits_scaling
              ("model", "logit_scale", 1.0))                 # Cohere: logits * logit_scale


def head_transform(model: torch.nn.Module) -> HeadTransform:
    cfg = model.config
    scale = 1.0
    if isinstance(getattr(model, "logit_scale", None), (int, float)):
        scale *= float(model.logit_scale)
    if getattr(cfg, "logits_scaling", None):
        scale /= float(cfg.logits_scaling)
    softcap = getattr(cfg, "final_logit_softcapping", None)
    return HeadTransform(scale, float(softcap) if softcap else None)


def _set(holder, attr: str, value) -> None:
    """setattr, also on a strictly typed config (Gemma 3n's refuses None for a float field): the value is read, not
    validated, at forward time."""
    try:
        setattr(holder, attr, value)
    except Exception:  # noqa: BLE001 - a validating __setattr__ (huggingface_hub's strict dataclasses)
        object.__setattr__(holder, attr, value)


@contextmanager
def _post_head_off(model: torch.nn.Module) -> Iterator[None]:
    """For one call, the model leaves its logits as the head returns them (the loss applies the transform)."""
    saved = []
    for holder_name, attr, neutral in _POST_HEAD:
        holder = model.config if holder_name == "config" else model
        if holder_name == "model" and not isinstance(getattr(holder, attr, None), (int, float)):
            continue
        if hasattr(holder, attr):
            value = getattr(holder, attr)
            try:
                _set(holder, attr, neutral)
            except BaseException:
                for done_holder, done_attr, done_value in saved:
                    _set(done_holder, done_attr, done_value)
                raise
            saved.append((holder, attr, value))
    try:
        yield
    finally:
        for holder, attr, value in saved:
            _set(holder, attr, value)


def takes_position_ids(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes position ids (a state-space model's has none: it is never packed)."""
    cached = model.__dict__.get("_trainer_takes_position_ids")
    if cached is None:
        params = inspect.signature(type(model).forward).parameters
        cached = "position_ids" in params
        model.__dict__["_trainer_takes_position_ids"] = cached
    return cached


def model_inputs(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> dict:
    """The forward's arguments: the tokens, their per-document position ids (when it takes them), no cache."""
    inputs = dict(input_ids=batch["input_ids"], use_cache=False)
    if takes_position_ids(model):
        inputs["position_ids"] = batch["position_ids"]
    return inputs


@contextmanager
def _head_computes_loss(head: torch.nn.Module, labels: torch.Tensor, index: torch.Tensor | None,
                        impl: str, transform: HeadTransform = HeadTransform()) -> Iterator[None]:
    """For one call, the lm_head's forward returns the summed loss instead of the logits.

    The loss runs inside the lm_head module's own call, so FSDP2's hooks on it still fire:
    its pre-forward hands over the unsharded (all-gathered, bf16) weight, and its
    post-forward reshards and registers the pre-backward hook that gathers it again and
    reduce-scatters its gradient. Reading `lm_head.weight` outside that call would see
    the sharded parameter and skip the gradient reduction.
    """
    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy_sum(hidden, head.weight, labels, impl=impl, index=index,
                                        scale=transform.scale, softcap=transform.softcap)

    saved = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if saved is None:
            del head.forward
        else:
            head.forward = saved


def router_aux_loss(model: torch.nn.Module, out) -> torch.Tensor | None:
    """coef x the model's load-balancing loss, when it computed one (config.output_router_logits)."""
    aux = getattr(out, "aux_loss", None)
    if aux is None:
        return None
    coef = getattr(model, "router_aux_loss_coef", None)
    coef = getattr(model.config, "router_aux_loss_coef", None) if coef is None else coef
    if coef is None:
        raise ValueError(f"{type(model).__name__} returned an aux_loss but has no router_aux_loss_coef to weigh it "
                         f"with; set router_aux_loss_coef in config.json, or output_router_logits false")
    return coef * aux.float()


def forward_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor],
                 loss: str = "chunked") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(sum of cross-entropy over the labelled tokens, weighted router aux loss or None) of one micro-batch.

    The one place that turns hidden states into a loss. `loss` is an implementation of
    trainer.model.losses (resolved, not `auto`): `plain` computes the full logits as the model
    returns them; the others never hold fp32 logits for the whole micro-batch and skip
    the lm_head for unlabelled tokens (`loss_index`, when the batch carries it).
    """
    inputs = model_inputs(model, batch)
    if loss == "plain":
        out = model(**inputs)
        ce = F.cross_entropy(out.logits.float().flatten(0, 1), batch["labels"].flatten(),
                             ignore_index=IGNORE_INDEX, reduction="sum")
        return ce, router_aux_loss(model, out)
    head = model.get_output_embeddings()
    with _head_computes_loss(head, batch["labels"], batch.get("loss_index"), loss, head_transform(model)), \
            _post_head_off(model):
        out = model(**inputs)
    return out.logits, router_aux_loss(model, out)


def token_loss_sum(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], loss: str = "chunked") -> torch.Tensor:
    """Sum of cross-entropy over the labelled tokens of one micro-batch (fp32): forward_loss without the aux loss."""
    return forward_loss(model, batch, loss)[0]


def _reshard(model: torch.nn.Module) -> None:
    """Back to the sharded parameters after a forward without backward.

    FSDP2 keeps the groups that do not reshard after forward (the root, the last layer)
    gathered, with their unsharded tensors registered on the modules: an optimizer built
    then would hold those instead of the sharded parameters.
    """
    for module in model.modules():
        if hasattr(module, "reshard") and hasattr(module, "unshard"):
            module.reshard()


def loss_path(model: torch.nn.Module, impl: str) -> str:
    """The implementation check_loss_path settled on for `impl` (`impl` itself until it has run)."""
    return model.__dict__.get("_trainer_loss_path", {}).get(impl, impl)


def check_loss_path(model: torch.nn.Module, impl: str, device: torch.device, *, collectives: Collectives) -> str:
    """`impl` when it gives the model's own loss, else the plain loss (or chunked for Liger); once per model.

    One forward of a 32-token batch with the model's own logits and one with `impl`: a model
    that changes its logits after the head in a way trainer.model.losses does not apply gets the
    plain loss, with a warning, instead of a loss that is not its own. Collective (every
    rank runs the same forwards; the most conservative answer wins).
    """
    checked = model.__dict__.setdefault("_trainer_loss_path", {})
    if impl == "plain" or impl in checked:
        return loss_path(model, impl)
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, 32), generator=g)
    labels = torch.roll(ids, -1, 1)
    labels[:, :4] = IGNORE_INDEX
    labels[:, -1] = IGNORE_INDEX
    batch = {"input_ids": ids, "position_ids": torch.arange(32)[None], "labels": labels}
    batch = to_device({**batch, "loss_index": loss_index(labels)}, device)
    transform = head_transform(model)
    order = [impl, "chunked"] if impl == "liger" else [impl]
    if impl == "liger" and transform.softcap and not liger_has_softcap():
        order = ["chunked"]
    rtol = 2e-2 if device.type == "cuda" else 1e-4  # bf16 logits in the model, fp32 softcap in the loss
    training = model.training
    model.eval()  # no dropout or router jitter: the same forward twice, and no draw from the training RNG
    try:
        with torch.no_grad():
            reference = forward_loss(model, batch, "plain")[0]
            if not bool(collectives.min([int(bool(torch.isfinite(reference)))], device)[0]):
                return impl  # weights that give NaN prove nothing here; StepHealth stops the run at its first step
            chosen = "plain"
            for candidate in order:
                try:
                    got = forward_loss(model, batch, candidate)[0]
                except Exception as e:  # noqa: BLE001 - a path this model's code does not allow: the plain loss
                    log.debug("loss %s fails for this model (%s: %s)", candidate, type(e).__name__, e)
                    continue
                if torch.allclose(got, reference, rtol=rtol, atol=1e-4):
                    chosen = candidate
                    break
    finally:
        model.train(training)
        _reshard(model)
    ranked = ("liger", "chunked", "plain")
    chosen = ranked[-collectives.min([-ranked.index(chosen)], device)[0]]
    if chosen != impl and collectives.leader:
        log.warning("loss %s does not reproduce %s's own loss on a 32-token check (known transform after the "
                    "head: %s): using %s", impl, type(model).__name__.removeprefix("FSDP"), transform, chosen)
    checked[impl] = chosen
    return chosen


def loss_index(labels: torch.Tensor) -> torch.Tensor:
    """Flat positions of the labelled tokens (host-side: the device never syncs to find them)."""
    return (labels.flatten() != IGNORE_INDEX).nonzero().flatten()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    micro_batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    device: torch.device,
    collectives: Collectives,
    grad_clip: float = TrainConfig.grad_clip,
    loss: str = DEFAULT_LOSS,
) -> StepOutput:
    """Forward/backward every micro-batch, clip, step optimizer and schedule; returns device tensors.

    `collectives` (trainer.loop.parallel, the loop's WorkerEnv) are the ranks the token count and the
    reported loss are summed over. With hybrid sharding the cross-replica all-reduce runs once per
    step, after the last micro-batch; the reduce-scatter inside a replica runs after each.
    """
    impl = check_loss_path(model, resolve_loss(loss, device), device, collectives=collectives)
    micro_batches = list(micro_batches)
    if impl != "plain":
        micro_batches = [{**mb, "loss_index": loss_index(mb["labels"])} for mb in micro_batches]
    # Counted on the host copies, before the transfer, so the step never waits on the device.
    local_loss_tokens = sum(int((mb["labels"] != IGNORE_INDEX).sum()) for mb in micro_batches)
    real_tokens = sum(int(mb["real_tokens"].sum()) if "real_tokens" in mb else mb["input_ids"].numel()
                      for mb in micro_batches)
    micro_batches = [to_device(mb, device) for mb in micro_batches]
    world = collectives.world_size
    global_tokens = collectives.sum(torch.tensor(float(local_loss_tokens), device=device))
    scale = world / global_tokens.clamp(min=1.0)

    sums = torch.zeros(2, device=device, dtype=torch.float32)  # cross-entropy, weighted aux loss
    has_aux = False
    defer_all_reduce = collectives.replicated and len(micro_batches) > 1
    for i, mb in enumerate(micro_batches):
        if defer_all_reduce:
            model.set_requires_all_reduce(i == len(micro_batches) - 1)
        mb_loss, aux = forward_loss(model, mb, impl)
        total = mb_loss * scale
        if aux is not None:  # the mean over every micro-batch of every rank, once FSDP averages the ranks
            total = total + aux / len(micro_batches)
            sums[1] += aux.detach()
            has_aux = True
        total.backward()
        sums[0] += mb_loss.detach()

    max_norm = grad_clip if grad_clip > 0 else float("inf")
    # on the host with CPU offload (its gradients are there): the health checks compare it on the device
    grad_norm = _local(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)).to(device)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    sums = collectives.sum(sums)
    mean_loss = sums[0] / global_tokens.clamp(min=1.0)
    aux_loss = sums[1] / (world * len(micro_batches)) if has_aux else None
    return StepOutput(loss=mean_loss + aux_loss if has_aux else mean_loss, grad_norm=grad_norm.detach(), lr=lr,
                      real_tokens=real_tokens, loss_tokens=local_loss_tokens, aux_loss=aux_loss,
                      global_loss_tokens=global_tokens)


def eval_loss(model: torch.nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, device: torch.device,
              collectives: Collectives, loss: str = DEFAULT_LOSS) -> dict[str, float]:
    """The mean cross-entropy over the trained tokens of every rank's held-out batches, reduced as the training
    loss is (a sum of token losses and a count of tokens over the ranks), without a gradient."""
    impl = check_loss_path(model, resolve_loss(loss, device), device, collectives=collectives)
    sums = torch.zeros(2, device=device, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for mb in batches:
                if impl != "plain":
                    mb = {**mb, "loss_index": loss_index(mb["labels"])}
                sums[1] += int((mb["labels"] != IGNORE_INDEX).sum())
                sums[0] += forward_loss(model, to_device(mb, device), impl)[0].double()
    finally:
        model.train(was_training)
    sums = collectives.sum(sums)
    return {"eval_loss": float(sums[0] / sums[1].clamp(min=1.0)), "eval_tokens": int(sums[1])}


class TrainingDiverged(UserError, RuntimeError):
    """A step's loss or gradient norm is not finite, or its gradient is exactly zero: stop instead of training on."""


class StepHealth:
    """The first unhealthy step, tracked on the device: add() never synchronises, check() does.

    The loss is all-reduced and the gradient norm global, so every rank sees the same
    values and raises at the same check: no rank is left waiting in a collective.
    """

    def __init__(self, device: torch.device):
        self.first = torch.full((4,), -1.0, device=device)  # step, loss, gradient norm, labelled tokens

    def add(self, step: int, out: StepOutput) -> None:
        loss, norm = out.loss.detach().float(), out.grad_norm.detach().float()
        tokens = (out.global_loss_tokens if out.global_loss_tokens is not None
                  else torch.tensor(float(out.loss_tokens))).to(loss.device, torch.float32)
        bad = ~torch.isfinite(loss) | ~torch.isfinite(norm) | (norm == 0)
        row = torch.stack([torch.full((), float(step), device=loss.device), loss, norm, tokens.reshape(())])
        self.first = torch.where(bad & (self.first[0] < 0), row, self.first)

    def check(self) -> None:
        step, loss, norm, tokens = self.first.tolist()
        if step < 0:
            return
        where = f"step {int(step)}: "
        if not math.isfinite(loss) or not math.isfinite(norm):
            raise TrainingDiverged(
                where + f"the loss is {loss:g} and the gradient norm {norm:g}: training diverged, so it stops "
                f"here (the last checkpoint is the last good state); lower --lr or raise --warmup-steps, and check "
                f"the model's weights and the data for NaN/Inf")
        if tokens == 0:
            raise TrainingDiverged(where + "the global batch has no labelled (response) token, so the gradient is "
                                           "zero; check that the dataset's records have responses")
        raise TrainingDiverged(
            where + f"the gradient is exactly zero (loss {loss:g}): nothing would be learned, so the run stops; the "
            f"loss does not depend on the weights (weights all zero, or a model whose logits are changed after the "
            f"head in a way the loss does not see)")
