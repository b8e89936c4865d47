"""A kernel recomputes a short chain of another kernel's ops instead of reading its result
(``graph._State._recompute_producers``), and reductions of the same rows share a kernel
(``_sibling_role``): what Inductor's lazy loops do, where reading a value from memory made one
kernel the producer of another and kept two kernels apart."""
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from tests.compiler.conftest import REL, rel_norm


def causal_lm_loss(logits, labels):
    """Hugging Face's ``ForCausalLMLoss``: labels shifted by a pad, a mean over the kept ones."""
    labels = F.pad(labels, (0, 1), value=-100)
    shift = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), shift.view(-1), ignore_index=-100)


def _labels(b, s, vocab, ignored=5):
    labels = torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(1))
    labels[0, :ignored] = -100
    return labels


def test_a_mean_cross_entropys_count_shares_the_kernel_of_its_sum_of_losses():
    """The count of kept labels (``labels != -100`` summed) and the sum of the picked losses both
    reduce the same (tokens,) rows: one kernel, not two. The loss's row kernel recomputes
    ``labels != -100`` and ``where(kept, labels, 0)`` from the labels instead of reading the
    counting kernel's results (which made that kernel its producer). Forward: the label shift's
    cat, the row kernel, the count with the mean (4 kernels before); values and gradient as eager's,
    ignored labels included."""
    logits = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(0), requires_grad=True)
    labels = _labels(2, 16, 128)

    def step(logits, labels):
        causal_lm_loss(logits, labels).backward()

    plan = klc.explain(step, logits, labels)
    forward = plan.graphs[0]
    assert forward.kind == "forward"
    names = [g.name for g in forward.groups]
    assert len(names) == 3, names
    count = [g for g in forward.groups if any(op.endswith("= div") for op in g.ops)]
    assert len(count) == 1 and any(op.endswith("= ne") for op in count[0].ops), names

    loss = causal_lm_loss(logits, labels)
    (grad,) = torch.autograd.grad(loss, logits)
    compiled = torch.compile(causal_lm_loss, backend="kernelab")
    got = compiled(logits, labels)
    (got_grad,) = torch.autograd.grad(got, logits)
    assert rel_norm(got, loss) <= REL and rel_norm(got_grad, grad) <= REL


def test_every_label_ignored_gives_nan_as_eager():
    """The mean over no kept label is 0/0: NaN, as eager's (the count and the sum in one kernel)."""
    logits = torch.randn(2, 8, 32, requires_grad=True)
    labels = torch.full((2, 8), -100)
    got = torch.compile(causal_lm_loss, backend="kernelab")(logits, labels)
    assert torch.isnan(got) and torch.isnan(causal_lm_loss(logits, labels))


def test_independent_reductions_of_the_same_rows_share_a_kernel():
    """Two sums over the rows of (4, 8) tensors that read different inputs and do not depend on
    each other: one kernel reading both (two before)."""
    a, b = torch.randn(4, 8), torch.randn(4, 8)

    def two_sums(a, b):
        return (a * 2).sum(-1) + (b.sin() * 3).sum(-1)

    assert len(klc.plan_kernels(two_sums, (a, b), {})) == 1
    assert rel_norm(torch.compile(two_sums, backend="kernelab")(a, b), two_sums(a, b)) <= REL


def causal_mask(scores, offset):
    """A 4-D causal mask as Hugging Face's SDPA path builds it (transformers 5.17 on the GPU):
    positions, their comparison through unsqueezes, expanded over the batch, applied by a where."""
    b, _, s, _ = scores.shape
    pos = torch.arange(s) + offset
    allowed = (pos[None, :] <= pos[:, None])[None, None].expand(b, 1, s, s)
    return torch.where(allowed, scores, torch.tensor(float("-inf"))).softmax(-1)


def test_a_causal_mask_is_recomputed_in_the_kernel_that_applies_it():
    """The positions (an arange plus an offset), their comparison and the masked softmax: one
    kernel. The positions kernel and the comparison kernel were kernels of their own, their
    results read through unsqueezes and an expand; the views are pushed down to the arange, the
    expand left to the kernel's broadcasting (three kernels before)."""
    scores = torch.randn(2, 4, 16, 16)
    offset = torch.tensor(3)
    kernels = klc.plan_kernels(causal_mask, (scores, offset), {})
    assert len(kernels) == 1, [k.name for k in kernels]
    assert rel_norm(torch.compile(causal_mask, backend="kernelab")(scores, offset),
                    causal_mask(scores, offset)) <= REL


def test_a_mask_read_by_two_kernels_is_recomputed_in_each():
    """The same comparison read by a softmax over (2, 4, 16, 16) scores and by a count of the
    allowed places: both kernels recompute it; the values as eager's."""
    scores = torch.randn(2, 4, 16, 16)

    def two_readers(scores):
        pos = torch.arange(16)
        allowed = (pos[None, :] <= pos[:, None])[None, None]
        probs = torch.where(allowed, scores, -1e4).softmax(-1)
        return probs, (allowed.expand(2, 1, 16, 16) * scores[:, :1]).sum(-1)

    got = torch.compile(two_readers, backend="kernelab")(scores)
    for g, w in zip(got, two_readers(scores)):
        assert rel_norm(g, w) <= REL


def repeat_kv(k, n_rep):
    b, kv, s, d = k.shape
    return k[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def test_a_copy_of_expanded_keys_keeps_reading_the_expand():
    """Hugging Face's ``repeat_kv`` (eager attention, or SDPA with a mask): keys computed by one
    kernel (RoPE), expanded over the query heads and copied by ``reshape``. The copy's kernel must
    not recompute the keys at their unexpanded shape: ``clone`` would then make the smaller
    tensor, and the plan's reference run (``kernelab.explain``) failed in the ``view`` after it
    ("shape '[2, 8, 16, 8]' is invalid for input of size 512", a Llama training step)."""
    k, q = torch.randn(2, 2, 16, 8), torch.randn(2, 8, 16, 8)

    def attend(k, q):
        keys = repeat_kv(k * 2.0 + 1.0, 4)
        return (q @ keys.transpose(-1, -2)).softmax(-1)

    plan = klc.explain(attend, k, q)
    assert plan.graphs
    assert rel_norm(torch.compile(attend, backend="kernelab")(k, q), attend(k, q)) <= REL
