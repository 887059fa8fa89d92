"""
Training on several processes, under torchrun: each process trains on its own batches and the
gradients are averaged. A small model is replicated (DDP); a Llama too large for one device is
sharded (FSDP2: parameters, gradients and optimizer state split over the ranks, one block gathered
at a time). train.py calls these functions; in one process they do what a single process needs.

    torchrun --standalone --nproc_per_node=8 train.py config/sbd_llama8b.py
"""

import os
import sys

import torch
import torch.distributed as dist


def state_dicts():
    """torch's distributed state dicts, imported when FSDP needs them (a second at import)."""
    import torch.distributed.checkpoint.state_dict as state_dicts

    return state_dicts


def whole_state():
    """A checkpoint's whole state, gathered on rank 0 and moved to its CPU."""
    return state_dicts().StateDictOptions(full_state_dict=True, cpu_offload=True)


def under_torchrun():
    return int(os.environ.get("RANK", -1)) != -1


def start(device):
    """-> (rank, world_size, device): under torchrun the process group is up and device is this
    rank's (cuda:LOCAL_RANK, or the CPU with gloo); otherwise (0, 1, device)."""
    if not under_torchrun():
        return 0, 1, device
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device


def wrap(model, compile, fsdp, ddp, param_dtype):
    """The model as the training loop calls it: torch.compile'd if compile, then sharded in place
    (FSDP: a compiled wrapper calls the sharded modules) or replicated (DDP)."""
    wrapped = torch.compile(model) if compile else model
    if fsdp:
        shard(model, param_dtype)
    elif ddp:
        wrapped = replicate(wrapped)
    return wrapped


def shard(model, param_dtype):
    """FSDP2, in place: a Llama's parameters, gradients and optimizer state split over the ranks,
    each block a unit gathered when it runs, its matrices computed in param_dtype, gradients summed
    in fp32. The blocks' inputs are not cast: the rotary cos/sin stay fp32, and activation
    checkpointing recomputes a block with the dtypes its forward saw."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mixed = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32,
                                 cast_forward_inputs=False)
    for block in model.layers:
        fully_shard(block, mp_policy=mixed)
    fully_shard(model, mp_policy=mixed)


def replicate(model):
    """DDP: the model on every rank, gradients averaged in backward."""
    ids = [int(os.environ["LOCAL_RANK"])] if next(model.parameters()).is_cuda else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def model_state(model, fsdp):
    """The model's whole state dict; under FSDP every rank must call this, rank 0's holds it."""
    if fsdp:
        return state_dicts().get_model_state_dict(model, options=whole_state())
    return model.state_dict()


def optimizer_state(model, optimizer, fsdp):
    """The optimizer's whole state, keyed by parameter name under FSDP (every rank calls it)."""
    if fsdp:
        return state_dicts().get_optimizer_state_dict(model, optimizer, options=whole_state())
    return optimizer.state_dict()


def load_optimizer_state(model, optimizer, state, fsdp):
    """optimizer_state's dict back into the optimizer: under FSDP each rank takes its shard."""
    if fsdp:
        whole = state_dicts().StateDictOptions(full_state_dict=True)  # each rank takes its shard
        state_dicts().set_optimizer_state_dict(model, optimizer, state, options=whole)
    else:
        optimizer.load_state_dict(state)


def finish():
    """Under torchrun: wait for rank 0's checkpoints (a rank that tears gloo down early can abort
    the others), then leave without the interpreter's teardown, where gloo (torch 2.13, CPU) can
    still hit std::terminate in a thread it joins; everything is saved by then."""
    if not under_torchrun():
        return
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
