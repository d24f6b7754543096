#!/usr/bin/env python3
"""Distributed training script template."""
# Seed 002's "Training Script Template", filled in with a small model and data set. Lines marked
# "filled in" are additions or the smallest edits that make it run on CPU as well as on GPUs:
# the seed imports torch (neural_arch does not need it), hard-codes backend="nccl" and "cuda:"
# devices, and leaves MyModel, dataset, batch_size, criterion, optimizer, num_epochs and targets
# undefined. Everything else is the seed's text. Run it any of these ways:
#
#     python -m neural_arch.distributed.launcher --nproc_per_node 2 examples/seed_templates/seed002_template.py
#     mpiexec -n 2 python examples/seed_templates/seed002_template.py
#     python examples/seed_templates/seed002_template.py
#
# Gradients are averaged automatically during loss.backward() (no sync call needed).

import os
import sys  # filled in
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # filled in: run from a checkout
# import torch   (filled in: commented out; neural_arch does not use torch)
from neural_arch.distributed import (
    init_process_group, destroy_process_group,
    DistributedDataParallel, DistributedSampler,
    get_world_size, get_rank
)

# ---- filled in: model, data, loss, optimizer, device choice ----------------------------------
from neural_arch import nn, optim  # noqa: E402
from neural_arch.backend import is_cupy_available  # noqa: E402
from neural_arch.core.tensor import Tensor, manual_seed  # noqa: E402
from neural_arch.data import DataLoader, load_digits  # noqa: E402
from neural_arch.data import TensorDataset  # noqa: E402

GPU = is_cupy_available() and os.environ.get("NEURAL_ARCH_TEMPLATE_GPU") == "1"
os.environ.setdefault("LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0"))  # mpiexec sets no LOCAL_RANK
num_epochs = 3
batch_size = 64  # global; the template divides it by the world size
X_all, y_all, _, _ = load_digits()
dataset = TensorDataset(X_all[:512], y_all[:512])
criterion = nn.CrossEntropyLoss()


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)
# ----------------------------------------------------------------------------------------------


def main():
    # Initialize distributed training
    init_process_group(backend="nccl" if GPU else None)  # filled in: the seed says backend="nccl"
    
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = get_world_size()
    rank = get_rank()
    
    print(f"Process {rank}/{world_size} on GPU {local_rank}")
    
    # Set device
    device = f"cuda:{local_rank}" if GPU else "cpu"  # filled in: CPU when there is no GPU
    
    # Create model and move to device
    manual_seed(0)  # filled in
    model = MyModel().to(device)
    model = DistributedDataParallel(model)
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # filled in
    
    # Create distributed dataset
    sampler = DistributedSampler(
        dataset, 
        num_replicas=world_size,
        rank=rank
    )
    
    dataloader = DataLoader(
        dataset,
        batch_size=batch_size // world_size,  # Scale batch size
        sampler=sampler
    )
    
    # Training loop
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        total = 0.0  # filled in
        
        for batch in dataloader:
            batch, targets = batch  # filled in: the loader yields (inputs, targets)
            batch = Tensor(batch).to(device)  # filled in: Tensor(...) around the array
            
            # Forward pass
            output = model(batch)
            loss = criterion(output, targets)
            
            # Backward pass with automatic gradient sync
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            total += float(loss.item())  # filled in
        print(f"rank {rank} epoch {epoch} mean loss {total / len(dataloader):.4f}")  # filled in
    
    # Cleanup
    destroy_process_group()

if __name__ == "__main__":
    main()
