"""Another script of the same project, never imported by prog.py: it serves the model with
CUDA graphs."""
import torch


def fast(model):
    return torch.compile(model, mode="reduce-overhead")
