"""A float32 training script whose speed and memory the GPU check measures before and after
ampify converts it: a Transformer encoder classifier and a torchvision ResNet-50 on random data.
MODEL picks one (environment variable), STEPS and WARMUP the loop. It prints one JSON line: the
time per step after warm-up and the peak memory the CUDA allocator held."""
import json
import os
import time

import torch
import torch.nn as nn

WARMUP = int(os.environ.get("WARMUP", "5"))
STEPS = int(os.environ.get("STEPS", "25"))
MODEL = os.environ.get("MODEL", "transformer")


class EncoderClassifier(nn.Module):
    def __init__(self, d_model=1024, layers=6, classes=10):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, nhead=16, dim_feedforward=4 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


def batches(device):
    while True:
        if MODEL == "resnet50":
            yield torch.randn(128, 3, 224, 224, device=device), torch.randint(0, 1000, (128,), device=device)
        else:
            yield torch.randn(32, 512, 1024, device=device), torch.randint(0, 10, (32,), device=device)


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    if MODEL == "resnet50":
        import torchvision
        model = torchvision.models.resnet50().to(device)
    else:
        model = EncoderClassifier().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    started = None
    for step, (inputs, targets) in enumerate(batches(device)):
        if step == WARMUP:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
        if step == WARMUP + STEPS:
            break
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    print(json.dumps({"model": MODEL, "ms_per_step": round(1000 * elapsed / STEPS, 2),
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2), "loss": float(loss)}))


if __name__ == "__main__":
    main()
