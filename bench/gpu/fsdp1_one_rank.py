"""FSDP1 (FullyShardedDataParallel) training in float32, one rank on NCCL: the GPU check converts
it with ampify (float16: a ShardedGradScaler, AMP236) and runs both. At POISON_STEP the batch is
scaled by 1e6: finite in float32 (a huge update), beyond float16's range under autocast, so the
gradients are inf and loss scaling must skip that step (the parameters do not change) and train
on after it. The first Linear's output dtype shows whether autocast ran."""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

POISON_STEP = 2
OUTPUT_DTYPES = []


def checksum(model):
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
    net[0].register_forward_hook(lambda module, inputs, output: OUTPUT_DTYPES.append(str(output.dtype)))
    model = FSDP(net, device_id=torch.cuda.current_device())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    changed = []
    for step in range(5):
        x = torch.randn(32, 64, device=device)
        y = torch.randn(32, 1, device=device)
        if step == POISON_STEP:
            x = x * 1e6
        before = checksum(model)
        optimizer.zero_grad()
        output = model(x)
        loss = nn.functional.mse_loss(output, y)
        loss.backward()
        optimizer.step()
        changed.append(checksum(model) != before)
    print(json.dumps({"changed": changed, "output_dtypes": sorted(set(OUTPUT_DTYPES)),
                      "finite": checksum(model) == checksum(model)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
