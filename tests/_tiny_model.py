"""The small attention model the FSDP2 tests shard, as cell text (rank side: it needs
``torch`` imported in the cell before it)."""

TINY = """
class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d, 2, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
    def forward(self, x):
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.ff(x)
class Tiny(torch.nn.Module):
    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([Block(d), Block(d)])
        self.head = torch.nn.Linear(d, vocab)
    def forward(self, tok):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x)
"""
