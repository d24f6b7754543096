#!/usr/bin/env python3
"""Distributed training script template."""
# Seed 001's "Training Script Template", filled in with a small model and data set (the seed leaves
# MyModel, dataset, criterion, optimizer, num_epochs and targets undefined). Lines marked
# "filled in" are additions or the smallest edits that make it run; everything else is the seed's
# text. Run it any of these ways:
#
#     python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/seed_templates/seed001_template.py
#     mpiexec -n 2 python examples/seed_templates/seed001_template.py
#     python examples/seed_templates/seed001_template.py
#
# ``model.sync_gradients()`` (the seed's manual style) is harmless: backward already averaged the
# gradients, and sync_gradients() then does nothing (no double averaging).

import os
import sys  # filled in
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # filled in: run from a checkout
from neural_arch.distributed import (
    init_process_group, destroy_process_group,
    DistributedDataParallel, DistributedSampler,
    get_world_size, get_rank
)

# ---- filled in: model, data, loss, optimizer -------------------------------------------------
from neural_arch import nn, optim  # noqa: E402
from neural_arch.core.tensor import Tensor, manual_seed  # noqa: E402
from neural_arch.data import load_digits  # noqa: E402

num_epochs = 2
X_all, y_all, _, _ = load_digits()


class PerSampleDataset:
    """dataset[idx] -> (input of shape (1, 64), target of shape (1,)): the seed loads one index at a time."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, idx):
        return Tensor(self.X[idx:idx + 1]), self.y[idx:idx + 1]


dataset = PerSampleDataset(X_all[:192], y_all[:192])
criterion = nn.CrossEntropyLoss()


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)
# ----------------------------------------------------------------------------------------------


def main():
    # Initialize distributed training (CPU backend recommended)
    init_process_group(backend="gloo")  # Use "nccl" only if CuPy is installed
    
    world_size = get_world_size()
    rank = get_rank()
    
    print(f"Process {rank}/{world_size}")
    
    # Create model (device handling simplified for CPU)
    manual_seed(0)  # filled in
    model = MyModel()
    model = DistributedDataParallel(model)
    optimizer = optim.SGD(model.parameters(), lr=0.02)  # filled in
    
    # Create distributed dataset sampler
    sampler = DistributedSampler(
        dataset_size=len(dataset),  # Pass size, not dataset
        num_replicas=world_size,
        rank=rank
    )
    
    # Training loop
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        total = 0.0  # filled in
        
        for idx in sampler:
            batch, targets = dataset[idx]  # Load data at sampled index (filled in: unpack the targets)
            
            # Forward pass
            output = model(batch)
            loss = criterion(output, targets)
            
            # Backward pass with MANUAL gradient sync
            loss.backward()
            model.sync_gradients()  # Required - auto sync not implemented
            optimizer.step()
            optimizer.zero_grad()
            total += float(loss.item())  # filled in
        print(f"rank {rank} epoch {epoch} mean loss {total / len(sampler):.4f}")  # filled in
    
    # Cleanup
    destroy_process_group()

if __name__ == "__main__":
    main()
