#!/usr/bin/python3
"""job.ddp on a rank catching up with gloo computes nothing for the model
(cohort_reform._Idle, docs/reform.md "Catching up in the background"):

1. its forward gives the module's outputs, the same values, each floating-point tensor a
   leaf that requires a gradient, in the same containers (tensor, tuple, named tuple,
   list, dict, a dict class that takes no pairs); integer tensors and other values as they are;
2. the script's loss and backward run on those outputs and end there: no parameter gets a
   gradient, and no autograd graph through the model is kept;
3. the module's attributes are its own; no_sync() is a context that does nothing;
4. a model with sparse gradients (an embedding with sparse=True) is told apart, and takes
   the path that computes (its gradients are not the dense ones handed over).

Usage: test_reform_idle.py SRC_DIR (exits 77 without torch)
"""
import collections
import sys

from checks import fail, torch_and_reform

torch, cr = torch_and_reform(sys.argv[1])

Out = collections.namedtuple("Out", "logits loss")


class Record(collections.OrderedDict):
    """A model output class that keeps its fields as attributes too and, as some libraries'
    do, cannot be made from (key, value) pairs."""

    def __init__(self, **fields):
        super().__init__(**fields)
        for k, v in fields.items():
            super().__setattr__(k, v)

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        super().__setattr__(k, v)


class Net(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.shape = shape
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        loss = y.square().mean()
        ids = torch.arange(3)
        return {"tensor": y, "tuple": (y, ids), "named": Out(y, loss), "list": [y, "tag"],
                "dict": {"logits": y, "ids": ids, "n": 3},
                "record": Record(logits=y, loss=loss)}[self.shape]


def leaves(x, found):
    """Every tensor of x, appended to found."""
    if torch.is_tensor(x):
        found.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            leaves(v, found)
    elif isinstance(x, (list, tuple)):
        for v in x:
            leaves(v, found)
    return found


def check(shape):
    torch.manual_seed(0)
    net = Net(shape)
    x = torch.randn(2, 4)
    want = net(x)
    idle = cr._Idle(net)
    got = idle(x)
    if type(got) is not type(want):
        fail("%s: the output's container %s, not %s" % (shape, type(got), type(want)))
    if shape == "named" and got._fields != want._fields:
        fail("named tuple: fields %s" % (got._fields,))
    if shape == "dict" and (sorted(got) != sorted(want) or got["n"] != 3):
        fail("dict: keys or values %s" % got)
    if shape == "record" and (got.loss is not got["loss"] or not got.loss.requires_grad):
        fail("a dict class with attributes: its attributes are not its leaves")
    g, w = leaves(got, []), leaves(want, [])
    if len(g) != len(w) or any(not torch.equal(a, b) for a, b in zip(g, w)):
        fail("%s: the values differ from the module's forward" % shape)
    for t in g:
        if t.is_floating_point() and not (t.is_leaf and t.requires_grad and t.grad_fn is None):
            fail("%s: a floating-point output is not a leaf that requires a gradient" % shape)
        if not t.is_floating_point() and t.requires_grad:
            fail("%s: an integer output requires a gradient" % shape)
    # 2. The script's loss and backward end at the outputs.
    loss = sum(t.float().sum() for t in g if t.is_floating_point())
    loss.backward()
    if any(p.grad is not None for p in net.parameters()):
        fail("%s: the backward reached the model's parameters" % shape)
    if any(t.grad is None for t in g if t.is_floating_point()):
        fail("%s: the backward did not reach the outputs" % shape)
    return idle, net


def main():
    for shape in ("tensor", "tuple", "named", "list", "dict", "record"):
        idle, net = check(shape)
    print("the forward: the module's values as leaves, in tensor, tuple, named tuple, list, "
          "dict and a dict class; the backward ends there")
    # 3. The module's attributes; no_sync.
    if idle.lin is not net.lin or idle.module is not net or idle.calls != 2:
        fail("the module's attributes are not the module's")
    with idle.no_sync():
        idle(torch.randn(1, 4))
    if net.calls != 3:
        fail("a forward under no_sync() did not run")
    print("the module's attributes are its own; no_sync() does nothing")
    # 4. Sparse gradients.
    dense = torch.nn.Sequential(torch.nn.Embedding(5, 2), torch.nn.Linear(2, 2))
    sparse = torch.nn.Sequential(torch.nn.Embedding(5, 2, sparse=True), torch.nn.Linear(2, 2))
    bag = torch.nn.EmbeddingBag(5, 2, sparse=True)
    if cr._sparse_gradients(dense) or not cr._sparse_gradients(sparse) \
            or not cr._sparse_gradients(bag):
        fail("sparse gradients not told apart")
    print("an embedding with sparse=True takes the path that computes")
    print("PASS")


if __name__ == "__main__":
    main()
