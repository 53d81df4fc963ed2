"""Are the generated Pathfinder images learnable? A small CNN on CPU answers it without a GPU.

A transformer that stays at 50% on Pathfinder could be failing to learn or could be fed images whose
labels cannot be read; a convolutional net, whose locality suits the task, separates the two. It trains
on a generated cache (`data.lra.dataset.build_pathfinder_dataset`, e.g. 40k train / 4k validation
images at 32 px) and prints validation accuracy per epoch.

    python benchmarks/check_pathfinder_cnn.py --cache /tmp/pfcheck/cache --epochs 12
"""

from __future__ import annotations

import argparse
import glob
import time

import datasets
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def images(split) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor(np.asarray(split["pixels"]), dtype=torch.float32)
    side = int(x.shape[1] ** 0.5)
    return x.view(-1, 1, side, side) / 255, torch.tensor(split["label"])


def conv_net() -> nn.Sequential:
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    return nn.Sequential(
        block(1, 32), block(32, 32), block(32, 64), nn.MaxPool2d(2),
        block(64, 64), block(64, 64), nn.MaxPool2d(2),
        block(64, 128), block(128, 128), nn.MaxPool2d(2),
        block(128, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 2),
    )  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", required=True, help="cache_dir the dataset was built into")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=12)
    a = parser.parse_args()
    torch.manual_seed(0)
    roots = glob.glob(f"{a.cache}/pathfinder{a.resolution}-*")
    if len(roots) != 1:
        raise SystemExit(f"expected one pathfinder{a.resolution} data set under {a.cache}, found {roots}")
    x, y = images(datasets.load_from_disk(roots[0] + "/train").with_format("numpy"))
    xv, yv = images(datasets.load_from_disk(roots[0] + "/validation").with_format("numpy"))
    print(f"{len(x)} train / {len(xv)} validation images, {y.float().mean():.3f} positive", flush=True)
    net = conv_net()
    opt = torch.optim.AdamW(net.parameters(), 2e-3, weight_decay=1e-4)
    for epoch in range(a.epochs):
        start = time.time()
        net.train()
        order = torch.randperm(len(x))
        for s in range(0, len(x) - 127, 128):
            rows = order[s : s + 128]
            loss = F.cross_entropy(net(x[rows]), y[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            right = sum(
                (net(xv[s : s + 500]).argmax(1) == yv[s : s + 500]).sum().item()
                for s in range(0, len(xv), 500)
            )
        print(
            f"epoch {epoch}: loss {loss.item():.3f} val acc {right / len(xv):.4f} ({time.time() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
