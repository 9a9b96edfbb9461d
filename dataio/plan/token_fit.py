"""Whether a token dataset holds one global batch of sequences: the arithmetic of the loader's warning.

Pure: no I/O. With concat packing and the tail dropped, an epoch of fewer tokens than world_size x
batch_size sequences of seq_len gives no batch at all (a sequence reads seq_len + 1 tokens, so the
true need is a little more: never a false alarm); the loader warns
naming seq_len (dataio/loader/opened.py). Aligned packing pads a sequence per document start, so tokens alone do not say.
"""

from __future__ import annotations


def token_shortfall(*, num_tokens: int, seq_len: int, batch_size: int, world_size: int, tail: str,
                    packing: str = "concat") -> str | None:
    """Why no batch can be cut (in words), or None when one global batch fits (or the tail is padded,
    or the packing is aligned)."""
    needed = world_size * batch_size * seq_len
    if tail != "drop" or packing != "concat" or num_tokens >= needed:
        return None
    return (f"the dataset holds {num_tokens} tokens, fewer than one global batch of sequences needs ({world_size} "
            f"rank(s) x batch_size {batch_size} x seq_len {seq_len} = {needed}): an epoch gives no batch; lower "
            "seq_len (or batch_size), or use fewer ranks")
