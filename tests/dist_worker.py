"""One process of tests/test_hf_distributed.py (run by torchrun): a patched tiny Qwen2-VL trained two steps under
DDP and FSDP2 (float32, bfloat16 mixed precision, packed rows), with sharded and full checkpoints reloaded.

Every rank takes its share of one global batch; the loss is the sum of token losses over the global token count,
so the processes together compute what one process computes on the whole batch. Rank 0 writes a JSON of losses.
"""
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(__file__))

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from transformers import Qwen2VLForConditionalGeneration

import ropekit
from test_hf import _qwen2_cfg, make_batch

SAMPLES = [
    [("T", 3), ("I", 4, 4), ("T", 2), ("V", 2, 4, 4), ("T", 2)],
    [("T", 4), ("I", 4, 8), ("T", 3)],
    [("T", 2), ("I", 8, 4), ("T", 1), ("I", 4, 4), ("T", 3)],
    [("T", 6), ("V", 2, 4, 8), ("T", 2)],
]
PATCH = dict(design="circle", age="alternate")


def build():
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(_qwen2_cfg(2))
    return ropekit.patch_model(model, **PATCH)


def token_loss(model, batch, total):
    """Summed next-token loss of ``batch`` over ``total`` tokens (the global batch's count)."""
    out = model(**batch)
    logits = out.logits.float()
    labels = batch["labels"][:, 1:]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")
    return loss / total


def batches(model, rank, world, packed):
    """This rank's share of the global batch: one padded batch of its samples, or one packed row of them."""
    samples = [make_batch([s], seed=i)[0] for i, s in enumerate(SAMPLES)][rank::world]
    if packed:
        row = ropekit.hf.pack(model, samples)
        return [row]
    out = []
    for s in samples:  # one sample per forward: no padding, so every token counts alike
        out.append(dict(s, labels=s["input_ids"]))
    return out


def global_tokens():
    return sum(make_batch([s], seed=i)[0]["input_ids"].shape[1] - 1 for i, s in enumerate(SAMPLES))


def train(model, base, rank, world, packed, steps=2):
    """``steps`` SGD steps of ``model`` (``base``: the patched model inside any wrapper); the global loss of each."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    total, losses = global_tokens(), []
    for _ in range(steps):
        opt.zero_grad()
        local = torch.zeros(())
        for b in batches(base, rank, world, packed):
            loss = token_loss(model, b, total) * world  # DDP / FSDP average gradients over the processes
            loss.backward()
            local = local + loss.detach().float() / world
        dist.all_reduce(local)
        losses.append(float(local))
        opt.step()
    return losses


def eval_loss(model, rank, world):
    total, local = global_tokens(), torch.zeros(())
    with torch.no_grad():
        for b in batches(model, rank, world, False):
            local = local + token_loss(model, b, total).float()
    dist.all_reduce(local)
    return float(local)


def main():
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    results = {}

    model = build()
    results["ddp"] = train(DistributedDataParallel(model), model, rank, world, packed=False)

    for name, policy, packed in (("fsdp2", None, False), ("fsdp2-bf16", torch.bfloat16, False),
                                 ("fsdp2-packed", None, True)):
        model = build()
        mp = MixedPrecisionPolicy(param_dtype=policy, reduce_dtype=torch.float32) if policy else MixedPrecisionPolicy()
        for layer in model.model.language_model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        results[name] = train(model, model, rank, world, packed=packed)
        if name == "fsdp2":
            # sharded checkpoint: save, load into a fresh sharded patched model, same loss
            path = os.path.join(out_dir, f"dcp-{world}")
            dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path)
            fresh = build()
            for layer in fresh.model.language_model.layers:
                fully_shard(layer)
            fully_shard(fresh)
            state = {"model": get_model_state_dict(fresh)}
            dcp.load(state, checkpoint_id=path)
            set_model_state_dict(fresh, state["model"])
            results["dcp-reloaded"] = eval_loss(fresh, rank, world)
            results["trained"] = eval_loss(model, rank, world)
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if rank == 0:  # a full checkpoint in a plain, unsharded patched model in this process
                plain = build()
                plain.load_state_dict(full)
                results["full-reloaded-patched"] = ropekit.hf.is_patched(plain)
                total = global_tokens()
                with torch.no_grad():
                    results["full-reloaded"] = float(sum(
                        token_loss(plain, b, total) for b in batches(plain, 0, 1, False)))
    if rank == 0:
        with open(os.path.join(out_dir, f"world{world}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
