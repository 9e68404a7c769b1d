"""GPT-2 124M training steps in PyTorch eager on one GPU: the comparison row of
`cargo xtask device-check` (same model and batch as scenarios/gpt2-124m-1xh200.toml).

bf16 autocast, fp32 master weights, AdamW, causal SDPA attention, tied embeddings, vocab
50,257 padded to 50,304 (as the scenario), sequence 1,024. Prints one JSON object: tokens/s, step time, peak memory, MFU
(6·N·tokens + attention FLOPs over the GPU's dense bf16 peak).
"""
import argparse, json, math, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc, self.out = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.heads = heads

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers=12, h=768, heads=12, vocab=50257, seq=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(h)

    def forward(self, tok):
        x = self.wte(tok) + self.wpe(torch.arange(tok.shape[1], device=tok.device))
        for b in self.blocks:
            x = b(x)
        return self.ln(x) @ self.wte.weight.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    # The padded vocabulary of scenarios/gpt2-124m-1xh200.toml (tokens still below 50,257).
    ap.add_argument("--vocab", type=int, default=50304)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    model = GPT(vocab=a.vocab, seq=a.seq).to(dev)
    # GPT-2's initialisation (normal, std 0.02, for every matrix): the loss starts near
    # ln(vocab), as Strata's does, rather than at hundreds of nats.
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    n_params = sum(p.numel() for p in model.parameters())
    tok = torch.randint(0, 50257, (a.batch, a.seq + 1), device=dev)
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for step in range(a.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tok[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    steady = sorted(times[3:])[len(times[3:]) // 2] if len(times) > 4 else times[-1]
    tokens = a.batch * a.seq
    flops = 6 * n_params * tokens + 12 * 12 * 768 * a.seq * tokens  # + causal attention (12·l·h·s per token, fwd+bwd)
    print(json.dumps({
        "framework": "pytorch-eager", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
        "params": n_params, "batch": a.batch, "seq": a.seq, "steps": a.steps,
        "step_s_median": steady, "tokens_per_s": tokens / steady,
        "mfu": flops / steady / (a.peak_tflops * 1e12),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(), "losses": losses,
    }))


if __name__ == "__main__":
    main()
