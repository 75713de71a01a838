"""An independent reference forward pass for meshnet's Llama-family models
(llama, mistral, qwen2), in numpy float64, reading the GGUF file itself.

It shares no code with meshnet: the GGUF parser below follows the published
GGUF v3 layout, and the forward pass follows llama.cpp's graph (RMSNorm,
Q/K/V projections with optional biases, RoPE normal or NeoX with optional
rope_freqs factors, grouped-query causal attention, SwiGLU FFN, final norm
and LM head, tied to token_embd when output.weight is absent).

Only F32 tensors are supported (the tests write F32 models).
"""
import struct

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


class GgufFile:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        if self._take(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = self._scalar(4)
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}")
        n_tensors = self._scalar(10)
        n_kv = self._scalar(10)
        self.meta = {}
        for _ in range(n_kv):
            key = self._string()
            self.meta[key] = self._value(self._scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar(4)
            dims = [self._scalar(10) for _ in range(n_dims)]
            ggml_type = self._scalar(4)
            offset = self._scalar(10)
            infos.append((name, dims, ggml_type, offset))
        align = self.meta.get("general.alignment", 32)
        data_start = (self.pos + align - 1) // align * align
        self.tensors = {}
        for name, dims, ggml_type, offset in infos:
            if ggml_type != 0:
                raise ValueError(f"tensor {name}: type {ggml_type} is not F32")
            count = int(np.prod(dims))
            arr = np.frombuffer(self.buf, dtype="<f4", count=count, offset=data_start + offset)
            # GGUF dims are ne0 (fastest) first: numpy shape is reversed.
            self.tensors[name] = arr.reshape(list(reversed(dims))).astype(np.float64)

    def _take(self, n):
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def _scalar(self, t):
        fmt = _SCALARS[t]
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def _string(self):
        n = self._scalar(10)
        return self._take(n).decode("utf-8", errors="surrogateescape")

    def _value(self, t):
        if t == 8:
            return self._string()
        if t == 9:
            et = self._scalar(4)
            n = self._scalar(10)
            return [self._value(et) for _ in range(n)]
        return self._scalar(t)


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, n_rot, base, neox, factors):
    """x: (T, heads, head_dim)."""
    out = x.copy()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    if factors is not None:
        inv = inv / factors
    theta = positions[:, None] * inv[None, :]  # (T, half)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[:, :, :half], x[:, :, half:n_rot]
        out[:, :, :half] = a * cos - b * sin
        out[:, :, half:n_rot] = a * sin + b * cos
    else:
        a, b = x[:, :, 0:n_rot:2], x[:, :, 1:n_rot:2]
        out[:, :, 0:n_rot:2] = a * cos - b * sin
        out[:, :, 1:n_rot:2] = a * sin + b * cos
    return out


def forward(g, ids):
    """Logits (T, vocab) for token ids (T,) at positions 0..T-1."""
    arch = g.meta["general.architecture"]
    hp = lambda k, d=None: g.meta.get(f"{arch}.{k}", d)
    n_embd, n_layers = hp("embedding_length"), hp("block_count")
    n_heads = hp("attention.head_count")
    n_kv = hp("attention.head_count_kv", n_heads)
    head_dim = n_embd // n_heads
    n_rot = hp("rope.dimension_count", head_dim)
    base = hp("rope.freq_base", 10000.0)
    eps = hp("attention.layer_norm_rms_epsilon", 1e-5)
    neox = arch in ("qwen2",)  # llama.cpp: LLAMA_ROPE_TYPE_NEOX for qwen2
    factors = g.tensors.get("rope_freqs.weight")
    t = g.tensors
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = t["token_embd.weight"][np.array(ids)]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for l in range(n_layers):
        p = f"blk.{l}."
        h = _rms_norm(x, t[p + "attn_norm.weight"], eps)
        q, k, v = (h @ t[p + f"attn_{n}.weight"].T + t.get(p + f"attn_{n}.bias", 0.0)
                   for n in ("q", "k", "v"))
        q = _rope(q.reshape(T, n_heads, head_dim), pos, n_rot, base, neox, factors)
        k = _rope(k.reshape(T, n_kv, head_dim), pos, n_rot, base, neox, factors)
        v = v.reshape(T, n_kv, head_dim)
        att = np.empty((T, n_heads, head_dim))
        for hd in range(n_heads):
            kv = hd // (n_heads // n_kv)
            s = q[:, hd, :] @ k[:, kv, :].T / np.sqrt(head_dim) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hd, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
        x = x + att.reshape(T, n_embd) @ t[p + "attn_output.weight"].T
        h = _rms_norm(x, t[p + "ffn_norm.weight"], eps)
        gate = h @ t[p + "ffn_gate.weight"].T
        up = h @ t[p + "ffn_up.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
    head = t.get("output.weight", t["token_embd.weight"])
    return _rms_norm(x, t["output_norm.weight"], eps) @ head.T
