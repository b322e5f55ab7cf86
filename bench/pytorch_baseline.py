"""PyTorch CPU baseline for `make bench`: the same DLRM, WideAndDeep, DeepFM,
DCN and MMoE shapes as rustrec's bench (Criteo Kaggle cardinalities capped at --cap rows, dim 16,
Adagrad on sparse embedding gradients, Adam on dense layers, batch 2048),
trained on synthetic batches held in memory (no input pipeline is timed,
which favours this baseline). Prints one JSON line per run. `--device cuda`
runs it on the GPU (the tables too), timed between synchronizations."""

import argparse
import json
import math
import resource
import time
import warnings

warnings.filterwarnings("ignore")  # numpy-less torch and sparse-invariant notices

import torch  # noqa: E402
from torch import nn

KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
          5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def mlp(sizes, last_relu=True):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """EasyRec's DLRM with arch_with_dense_feature: the dot interaction's
    upper triangle over the bottom MLP's output and the embeddings, then the
    embeddings themselves and the bottom output, into the top MLP."""

    def __init__(self, cards, dim=16):
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(c, dim, mode="sum", sparse=True) for c in cards)
        self.bot = mlp([13, 512, 256, 64, dim])
        n = len(cards) + 1
        self.tri = torch.triu_indices(n, n, offset=1)
        self.top = mlp([n * (n - 1) // 2 + len(cards) * dim + dim, 512, 256])
        self.out = nn.Linear(256, 1)

    def forward(self, dense, ids, offsets):
        d = self.bot(dense)
        e = [t(ids[:, i], offsets) for i, t in enumerate(self.emb)]
        z = torch.stack([d] + e, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.tri[0], self.tri[1]]
        return self.out(self.top(torch.cat([dots] + e + [d], dim=1))).squeeze(1)


class WideAndDeep(nn.Module):
    def __init__(self, cards, dim=16):
        super().__init__()
        self.wide = nn.ModuleList(nn.EmbeddingBag(c, 1, mode="sum", sparse=True) for c in cards)
        self.emb = nn.ModuleList(nn.EmbeddingBag(c, dim, mode="sum", sparse=True) for c in cards)
        self.dnn = mlp([13 + len(cards) * dim, 1024, 512, 256])
        self.out = nn.Linear(256, 1)

    def forward(self, dense, ids, offsets):
        w = sum(t(ids[:, i], offsets) for i, t in enumerate(self.wide))
        e = [t(ids[:, i], offsets) for i, t in enumerate(self.emb)]
        h = self.dnn(torch.cat([dense] + e, dim=1))
        return (self.out(h) + w).squeeze(1)


class DeepFM(nn.Module):
    """EasyRec's DeepFM with final_dnn: the wide sum, the FM term over the
    deep group's embeddings and the DNN, concatenated into final_dnn."""

    def __init__(self, cards, dim=16):
        super().__init__()
        self.wide = nn.ModuleList(nn.EmbeddingBag(c, 1, mode="sum", sparse=True) for c in cards)
        self.emb = nn.ModuleList(nn.EmbeddingBag(c, dim, mode="sum", sparse=True) for c in cards)
        self.dnn = mlp([len(cards) * dim + 13, 256, 128, 64])
        self.final = mlp([1 + dim + 64, 256, 128, 64])
        self.out = nn.Linear(64, 1)

    def forward(self, dense, ids, offsets):
        w = sum(t(ids[:, i], offsets) for i, t in enumerate(self.wide))
        e = [t(ids[:, i], offsets) for i, t in enumerate(self.emb)]
        v = torch.stack(e, dim=1)
        s = v.sum(dim=1)
        fm = 0.5 * (s * s - (v * v).sum(dim=1))
        h = self.dnn(torch.cat(e + [dense], dim=1))
        return self.out(self.final(torch.cat([w, fm, h], dim=1))).squeeze(1)


class DCN(nn.Module):
    """Deep tower and 5 cross layers over one group, then final_dnn."""

    def __init__(self, cards, dim=16, cross_num=5):
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(c, dim, mode="sum", sparse=True) for c in cards)
        d = 13 + len(cards) * dim
        self.deep = mlp([d, 256, 128, 96, 64])
        self.cross_w = nn.ParameterList(nn.Parameter(torch.randn(d, 1) * 0.05) for _ in range(cross_num))
        self.cross_b = nn.ParameterList(nn.Parameter(torch.zeros(d)) for _ in range(cross_num))
        self.final = mlp([64 + d, 128, 96, 64, 32, 16])
        self.out = nn.Linear(16, 1)

    def forward(self, dense, ids, offsets):
        e = [t(ids[:, i], offsets) for i, t in enumerate(self.emb)]
        x0 = torch.cat([dense] + e, dim=1)
        h = self.deep(x0)
        xl = x0
        for w, b in zip(self.cross_w, self.cross_b):
            xl = x0 * (xl @ w) + b + xl
        return self.out(self.final(torch.cat([h, xl], dim=1))).squeeze(1)


class MMoE(nn.Module):
    """4 experts, a softmax gate and a tower per task; two tasks on the one
    label (their losses summed)."""

    def __init__(self, cards, dim=16, experts=4, tasks=2):
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(c, dim, mode="sum", sparse=True) for c in cards)
        d = 13 + len(cards) * dim
        self.experts = nn.ModuleList(mlp([d, 256, 192, 128, 64]) for _ in range(experts))
        self.gates = nn.ModuleList(nn.Linear(d, experts) for _ in range(tasks))
        self.towers = nn.ModuleList(mlp([64, 256, 192, 128, 64]) for _ in range(tasks))
        self.outs = nn.ModuleList(nn.Linear(64, 1) for _ in range(tasks))

    def forward(self, dense, ids, offsets):
        e = [t(ids[:, i], offsets) for i, t in enumerate(self.emb)]
        x = torch.cat([dense] + e, dim=1)
        ex = torch.stack([m(x) for m in self.experts], dim=1)
        logits = []
        for g, t, o in zip(self.gates, self.towers, self.outs):
            gate = torch.softmax(g(x), dim=1).unsqueeze(-1)
            logits.append(o(t((ex * gate).sum(dim=1))).squeeze(1))
        return torch.stack(logits, dim=1)


MODELS = {"DLRM": DLRM, "WideAndDeep": WideAndDeep, "DeepFM": DeepFM, "DCN": DCN, "MMoE": MMoE}


def zipf_ids(card, n, gen):
    # Log-uniform ranks (Zipf with exponent 1), spread over the table.
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    r = torch.floor(torch.exp(u * math.log(card + 1))).long() - 1
    return (r * 2654435761) % card


def batches(cards, batch, count, seed):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        dense = torch.rand(batch, 13, generator=gen)
        ids = torch.stack([zipf_ids(c, batch, gen) for c in cards], dim=1)
        label = (torch.rand(batch, generator=gen) < 0.3).float()
        out.append((dense, ids, label))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=2048)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--cap", type=int, default=1_000_000)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    a = p.parse_args()
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cards = [min(c, a.cap) for c in KAGGLE]
    model = MODELS[a.model](cards).to(device)
    sparse = [p for n, p in model.named_parameters() if n.startswith(("emb", "wide"))]
    dense = [p for n, p in model.named_parameters() if not n.startswith(("emb", "wide"))]
    opt_sparse = torch.optim.Adagrad(sparse, lr=0.05)
    opt_dense = torch.optim.Adam(dense, lr=0.001)
    loss_fn = nn.BCEWithLogitsLoss()
    data = [tuple(t.to(device) for t in b) for b in batches(cards, a.batch_size, 8, seed=1)]
    offsets = torch.arange(a.batch_size, device=device)

    def step(b):
        dense_x, ids, label = b
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        logits = model(dense_x, ids, offsets)
        if logits.dim() == 2:  # one column per task, each trained on the label
            loss = sum(loss_fn(logits[:, k], label) for k in range(logits.shape[1]))
        else:
            loss = loss_fn(logits, label)
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
        return loss

    for i in range(3):
        step(data[i % len(data)])
    sync()
    t = time.perf_counter()
    for i in range(a.steps):
        step(data[i % len(data)])
    sync()
    secs = time.perf_counter() - t
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({
        "stack": "pytorch " + torch.__version__.split("+")[0],
        "model": a.model,
        "device": device.type,
        "samples_per_sec": a.steps * a.batch_size / secs,
        "peak_mb": peak_mb,
    }))


if __name__ == "__main__":
    main()
