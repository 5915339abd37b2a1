"""The KL reference's weights: refreshed to the policy's (`ref_refresh_every`), saved with a
checkpoint when they have changed, and loaded again on resume, whole or as ZeRO-3 shards.

Under ZeRO-3 neither model is whole on any rank, and a sharded module's `state_dict()` holds
empty tensors while `load_state_dict` of whole ones reports every key matched and changes
nothing. So: a refresh copies each rank's shard of the policy into its shard of the reference
(the two are partitioned alike: the same parameters over the same ranks); a checkpoint gathers
each parameter whole; a resume writes each whole parameter on rank 0 and re-partitions it. Every
rank calls these together under ZeRO-3.
"""

from __future__ import annotations

import torch

from training.logits import unwrapped


def partitioned(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are ZeRO-3 shards (DeepSpeed tags them `ds_id`)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def refresh(reference: torch.nn.Module, policy: torch.nn.Module) -> None:
    """The reference's weights become the policy's."""
    target, source = unwrapped(reference), unwrapped(policy)
    if not partitioned(source):
        target.load_state_dict(source.state_dict())
        return
    pairs = _pairs(target, source)
    with torch.no_grad():
        for name, mine, theirs in pairs:
            if mine.ds_tensor.shape != theirs.ds_tensor.shape:
                raise ValueError(
                    f"the reference's shard of {name} is {tuple(mine.ds_tensor.shape)}, the "
                    f"policy's {tuple(theirs.ds_tensor.shape)}: they are not partitioned alike"
                )
            mine.ds_tensor.copy_(theirs.ds_tensor)


def _pairs(target: torch.nn.Module, source: torch.nn.Module):
    mine, theirs = dict(target.named_parameters()), dict(source.named_parameters())
    if mine.keys() != theirs.keys():
        missing = sorted(set(mine) ^ set(theirs))[:5]
        raise ValueError(f"the reference and the policy differ in parameters: {missing}")
    return [(name, mine[name], theirs[name]) for name in mine]


def state(reference: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The reference's whole weights on the CPU (under ZeRO-3 every rank gathers each parameter
    in turn and holds the whole state)."""
    module = unwrapped(reference)
    if not partitioned(module):
        return {key: value.detach().cpu() for key, value in module.state_dict().items()}
    import deepspeed

    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            out[name] = param.detach().cpu().clone()
    return out


def load_state(reference: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """The reference's weights from `state()`'s."""
    module = unwrapped(reference)
    if not partitioned(module):
        module.load_state_dict(weights)
        return
    import deepspeed

    params = dict(module.named_parameters())
    if params.keys() != weights.keys():
        missing = sorted(set(params) ^ set(weights))[:5]
        raise ValueError(f"the saved reference does not match the model: {missing}")
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    with torch.no_grad():
        for name, param in params.items():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                if rank == 0:
                    param.copy_(weights[name])
