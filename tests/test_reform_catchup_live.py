#!/usr/bin/python3
"""A donor's stream of the state in the background sends from its live tensors, no copy
(cohort_reform._CatchUp, docs/reform.md "Catching up in the background"):

1. the parameters and the optimizer's state of the donor's share are its own memory, not
   copies; the module's buffers (which a forward may write) and a parameter that shares its
   memory with another one otherwise than as the same tensor are copied at the join;
2. at the donor's first update after the join, the tensors whose sends have not ended
   (from _CatchUp.progress on) get new memory in every holder: the update writes that, the
   stream's memory keeps the agreed step's values bit for bit, and those already sent are
   left alone (updated in place);
3. the update's result is the same, bit for bit, as without the move: parameters and
   optimizer state alike, and two parameters that were one tensor stay one.

Usage: test_reform_catchup_live.py SRC_DIR (exits 77 without torch)
"""
import sys

from checks import fail, torch_and_reform

torch, cr = torch_and_reform(sys.argv[1])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight            # tied: the same Parameter
        self.mid = torch.nn.Linear(8, 8)
        self.alias = torch.nn.Parameter(self.mid.weight.data)  # the same memory, one view
        flat = torch.randn(12)
        self.part_a = torch.nn.Parameter(flat[:6])    # two views of one memory: copied
        self.part_b = torch.nn.Parameter(flat[6:])
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        h = self.mid(self.emb(x)) + (self.alias.sum() + self.part_a.sum() + self.part_b.sum())
        self.count += 1
        return self.head(h).square().mean()


def trained(seed):
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    for i in range(2):
        opt.zero_grad()
        net(torch.arange(4) + i).backward()
        opt.step()
    return net, opt


def update(net, opt):
    opt.zero_grad()
    net(torch.arange(4) + 7).backward()
    opt.step()


def state_of(net, opt):
    tensors = []
    cr._outline({"model": net.state_dict(), "optimizer": opt.state_dict()}, tensors)
    return [t.clone() for t in tensors]


def main():
    net, opt = trained(0)
    job = type("Job", (), {})()
    job.module, job.optimizer = net, opt
    tensors = []
    cr._outline({"model": net.state_dict(), "optimizer": opt.state_dict()}, tensors)
    owned = [t for t in tensors if t.numel()]
    cu = object.__new__(cr._CatchUp)
    cu.job, cu.dev, cu.progress = job, torch.device("cpu"), 0
    share = cu._live_share(owned)

    # 1. Live: parameters and optimizer state; copied: the buffer and the two views.
    live_ptrs = {p.data_ptr() for p in net.parameters()
                 if p is not net.part_a and p is not net.part_b}
    live_ptrs |= {v.data_ptr() for st in opt.state.values() for v in st.values()}
    copied = {net.count.data_ptr(), net.part_a.data_ptr(), net.part_b.data_ptr()}
    for t, s, hs in zip(owned, share, cu.live):
        if t.data_ptr() in copied:
            if s.data_ptr() == t.data_ptr() or hs is not None or not torch.equal(s, t):
                fail("a buffer or a view of shared memory was not copied at the join")
        elif t.data_ptr() in live_ptrs:
            if s.data_ptr() != t.data_ptr() or not hs:
                fail("a parameter or optimizer state tensor was copied (%s)" % (tuple(t.shape),))
        else:
            fail("a tensor of the share is neither live nor copied: %s" % (tuple(t.shape),))
    print("the share: %d live tensors, %d copied at the join"
          % (sum(1 for h in cu.live if h), sum(1 for h in cu.live if not h)))

    # 2. The first update after the join, half the share sent.
    cu.progress = len(share) // 2
    before = [s.clone() for s in share]
    cu.release_live()
    update(net, opt)
    for i, (s, b, t) in enumerate(zip(share, before, owned)):
        if i >= cu.progress and not torch.equal(s, b):
            fail("tensor %d, not sent yet at the update, changed in the stream's memory" % i)
    moved = sum(1 for i, s in enumerate(share) if i >= cu.progress
                and s.data_ptr() in live_ptrs)
    if not moved:
        fail("no tensor of the share was moved at the update")
    sent = [s for i, s in enumerate(share[:cu.progress]) if s.data_ptr() in live_ptrs]
    current = {p.data_ptr() for p in net.parameters()}
    current |= {v.data_ptr() for st in opt.state.values() for v in st.values()}
    if not sent or any(s.data_ptr() not in current for s in sent):
        fail("a tensor already sent did not stay the holder's memory")
    print("the update: %d tensors not sent moved, the stream's memory kept; %d sent updated "
          "in place" % (moved, len(sent)))

    # 3. The same result as an update without the move.
    ref_net, ref_opt = trained(0)
    update(ref_net, ref_opt)
    got, want = state_of(net, opt), state_of(ref_net, ref_opt)
    if len(got) != len(want) or any(not torch.equal(a, b) for a, b in zip(got, want)):
        fail("the update after the move differs from one without it")
    if net.alias.data_ptr() != net.mid.weight.data_ptr():
        fail("two parameters of one memory were given two after the move")
    if net.head.weight is not net.emb.weight:
        fail("the tied parameter came apart")
    print("the update after the move: the same parameters and optimizer state, bit for bit")
    print("PASS")


if __name__ == "__main__":
    main()
