"""The whole training iteration in one compiled function, as the GPU test
of it (test_torch_training.py) and bench/torch_compiled_autograd.py run it.
Import it only after cgtree.torch where cgtree runs (it imports torch)."""
import torch


def compiled_whole_step(model, backend, set_to_none=True):
    """zero_grad, forward (the mean square of model's output), backward()
    and an AdamW step (capturable) in one function compiled with backend;
    returns it (it takes a batch, returns the loss) and the optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    def train_step(x):
        opt.zero_grad(set_to_none=set_to_none)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    return torch.compile(train_step, backend=backend), opt
