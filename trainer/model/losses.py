"""Cross-entropy of the lm_head without the fp32 logits of the whole micro-batch.

The plain loss materialises logits of tokens x vocab in fp32 (16 sequences of 2048
tokens x 151936 = 20 GB for Qwen2.5), which is what limits the micro-batch. Here the
lm_head matmul and the cross-entropy run chunk by chunk of tokens, and the gradients of
the hidden states and of the weight are computed in the same pass (the loss is a scalar,
so backward only rescales them): one matmul for the logits and two for the gradients,
no recomputation, and at most one chunk of logits alive at a time.

The numbers are those of the plain loss: logits in the compute dtype, upcast to fp32
for the softmax, the logits gradient cast back to the compute dtype before the matmuls,
as autograd does for `F.cross_entropy(F.linear(h, w).float(), y)`. The weight gradient
is accumulated over chunks in fp32 and rounded once.

What a model does to its logits after the head is part of its loss: `scale` multiplies
the logits (Cohere's logit_scale, 1 / Granite's logits_scaling) and `softcap` applies
`softcap * tanh(logits / softcap)` (Gemma's final_logit_softcapping), in fp32, in every
implementation here; trainer.loop.step reads them from the model and checks the result
against the model's own logits.

Liger's fused linear cross-entropy (Triton, GPU only) is used instead when asked for and
installed. Imports only torch.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
IMPLEMENTATIONS = ("chunked", "liger", "plain")
DEFAULT_CHUNK_BYTES = 1 << 30


def chunk_rows_for(vocab_size: int, budget_bytes: int = DEFAULT_CHUNK_BYTES, softcap: bool = False) -> int:
    """Tokens per chunk so that a chunk's logits (fp32 + a low-precision copy, + the tanh with a softcap) fit."""
    rows = budget_bytes // ((10 if softcap else 6) * vocab_size)
    return max(64, rows // 64 * 64)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_rows, ignore_index, may_ignore, scale, softcap):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n = hidden.shape[0]
        loss = torch.zeros((), device=hidden.device, dtype=torch.float32)
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_w else None
        for start in range(0, n, chunk_rows):
            h = hidden[start:start + chunk_rows]
            y = labels[start:start + chunk_rows]
            logits = (h @ weight.t()).float()
            if scale != 1.0:
                logits.mul_(scale)
            tanh = None
            if softcap:
                tanh = logits.div_(softcap).tanh_()
                logits = tanh * softcap
            keep = (y != ignore_index) if may_ignore else None
            target = y.clamp(min=0) if may_ignore else y
            lse = torch.logsumexp(logits, dim=1)
            token_loss = lse - logits.gather(1, target[:, None])[:, 0]
            loss += (token_loss * keep).sum() if keep is not None else token_loss.sum()
            if not (need_h or need_w):
                continue
            probs = logits.sub_(lse[:, None]).exp_()  # softmax in place: d loss / d logits = p - onehot
            minus_one = -(keep.to(probs.dtype) if keep is not None else torch.ones_like(lse))
            probs.scatter_add_(1, target[:, None], minus_one[:, None])
            if keep is not None:
                probs.mul_(keep[:, None])
            if tanh is not None:  # d softcap(x) / dx = 1 - tanh^2
                probs.mul_(tanh.mul_(tanh).neg_().add_(1.0))
            if scale != 1.0:
                probs.mul_(scale)
            g = probs.to(hidden.dtype)
            del probs, logits, tanh
            if need_h:
                grad_h[start:start + chunk_rows] = g @ weight
            if need_w:
                if g.dtype == torch.float32:
                    grad_w.addmm_(g.t(), h)
                else:
                    grad_w += g.t() @ h
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_h, grad_w)  # grad_w stays fp32 until scaled: one rounding, as in plain
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return (grad_h * grad_out.to(grad_h.dtype) if grad_h is not None else None,
                (grad_w * grad_out).to(ctx.weight_dtype) if grad_w is not None else None,
                None, None, None, None, None, None)


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                                 chunk_rows: int | None = None, ignore_index: int = IGNORE_INDEX,
                                 may_ignore: bool = True, scale: float = 1.0,
                                 softcap: float | None = None) -> torch.Tensor:
    """Sum over tokens of CE(softcap(scale * hidden @ weight.T), labels); hidden [N, d], weight [V, d], labels [N]."""
    rows = chunk_rows or chunk_rows_for(weight.shape[0], softcap=bool(softcap))
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, labels, rows, ignore_index, may_ignore,
                                            float(scale), float(softcap) if softcap else None)


def transformed_logits(logits: torch.Tensor, scale: float = 1.0, softcap: float | None = None) -> torch.Tensor:
    """fp32 logits after the model's own post-head transform."""
    logits = logits.float()
    if scale != 1.0:
        logits = logits * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


@functools.lru_cache(maxsize=None)
def liger_available() -> bool:
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or installed without a working Triton
        return False
    return True


def liger_has_softcap() -> bool:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as flce

    return "softcap" in inspect.signature(flce).parameters


def liger_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                               ignore_index: int = IGNORE_INDEX, scale: float = 1.0,
                               softcap: float | None = None) -> torch.Tensor:
    """Liger's fused linear cross-entropy (sum), weight gradient accumulated in fp32 when it can.

    The logit scale is folded into the hidden states (the matmul is linear); the softcap is
    Liger's own `softcap` argument.
    """
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as flce

    params = inspect.signature(flce).parameters
    kwargs = {"ignore_index": ignore_index, "reduction": "sum"}
    if weight.dtype != torch.float32 and "accum_dtype" in params:
        kwargs["accum_dtype"] = torch.float32
    if softcap:
        if not liger_has_softcap():
            raise ValueError("this liger-kernel has no softcap argument: the model's logit softcapping needs it")
        kwargs["softcap"] = float(softcap)
    out = flce(hidden * scale if scale != 1.0 else hidden, weight, labels, **kwargs)
    return out[0] if isinstance(out, tuple) else getattr(out, "loss", out)


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                             impl: str = "chunked", index: torch.Tensor | None = None,
                             chunk_rows: int | None = None, ignore_index: int = IGNORE_INDEX,
                             scale: float = 1.0, softcap: float | None = None) -> torch.Tensor:
    """Summed token cross-entropy of the lm_head, fp32 0-dim tensor.

    `index` (flat positions of the labelled tokens, computed on the host) restricts the
    lm_head to those tokens: prompt tokens of instruction data cost no vocabulary matmul.
    `scale` and `softcap`: the model's transform of its logits (see the module docstring).
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    if index is not None:
        hidden, labels = hidden.index_select(0, index), labels.index_select(0, index)
    if impl == "plain":
        return F.cross_entropy(transformed_logits(F.linear(hidden, weight), scale, softcap), labels,
                               ignore_index=ignore_index, reduction="sum")
    if impl == "liger" and hidden.shape[0] > 0:
        return liger_linear_cross_entropy(hidden, weight, labels, ignore_index=ignore_index, scale=scale,
                                          softcap=softcap)
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"loss implementation {impl!r}: use one of {', '.join(IMPLEMENTATIONS)}")
    return chunked_linear_cross_entropy(hidden, weight, labels, chunk_rows=chunk_rows, ignore_index=ignore_index,
                                        may_ignore=index is None, scale=scale, softcap=softcap)
