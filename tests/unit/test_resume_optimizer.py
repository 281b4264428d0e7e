"""A resumed optimizer steps bitwise as the uninterrupted one, from every step: DeepSpeed's FusedAdam on the
CPU accelerator (the C++ CPU Adam kernel), its state dict loaded at step k and the kernel's step state
replayed (checkpoints.replay_cpu_adam_steps), against the same optimizer run straight through."""

import copy

import pytest
import torch

from largetrain_core.training import distributed
from largetrain_core.training.checkpoints import replay_cpu_adam_steps

pytestmark = pytest.mark.unit

STEPS = 14  # beta1 0.9's float32 power drifts from pow() at steps 9, 12 and 14; beta2 0.95's from step 6 on


def _adam(param: torch.Tensor):
    distributed.prepare_op_builds()  # the op built once per virtualenv (make install), not per test
    from deepspeed.ops.adam import FusedAdam

    p = torch.nn.Parameter(param.clone())
    return p, FusedAdam([p], lr=5e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, adam_w_mode=True)


def _step(p, opt, step: int) -> None:
    p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step))
    opt.step()


def test_resume_at_every_step_steps_as_the_uninterrupted_optimizer():
    start = torch.randn(64, generator=torch.Generator().manual_seed(0))
    p, opt = _adam(start)
    saved = {}  # step -> (weights, optimizer state dict) after it
    for step in range(1, STEPS + 1):
        _step(p, opt, step)
        saved[step] = (p.detach().clone(), copy.deepcopy(opt.state_dict()))
    want = p.detach().clone()

    def resumed(k: int, replay: bool) -> torch.Tensor:
        q, o = _adam(saved[k][0])
        o.load_state_dict(copy.deepcopy(saved[k][1]))
        if replay:
            assert replay_cpu_adam_steps(o) == k
        for step in range(k + 1, STEPS + 1):
            _step(q, o, step)
        return q.detach()

    unreplayed = [k for k in range(1, STEPS) if not torch.equal(resumed(k, replay=False), want)]
    assert unreplayed, "without the replay some resume must differ (the pow path after a jump in the step)"
    assert [k for k in range(1, STEPS) if not torch.equal(resumed(k, replay=True), want)] == []


def test_nothing_to_replay_before_the_first_step_or_for_another_optimizer():
    p, opt = _adam(torch.zeros(4))
    assert replay_cpu_adam_steps(opt) == 0
    assert replay_cpu_adam_steps(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])) == 0
