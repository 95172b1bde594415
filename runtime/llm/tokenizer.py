"""The model's tokenizer, built from the GGUF vocabulary with Hugging Face
`tokenizers` so that it splits text exactly like llama.cpp does.

* ``tokenizer.ggml.model == "llama"`` (SentencePiece BPE): llama.cpp repeatedly
  merges the adjacent pair whose concatenation is the highest-scoring vocabulary
  piece (ties: leftmost), then falls back to <0xXX> byte tokens for characters
  outside the vocabulary. That is a BPE whose merge ranks are the scores of the
  merged pieces: we derive the merges from the vocabulary and scores. (This
  assumes, as SentencePiece guarantees, that every character of a piece is a
  piece itself.)
* ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE): the file's merges, the
  pre-tokenizer regex of ``tokenizer.ggml.pre`` (table below, as llama.cpp
  src/llama-vocab.cpp lists them), GPT-2's byte-to-unicode map.

Control tokens (type 3) are special added tokens; user-defined tokens (type 4)
are matched in the raw text first, as llama.cpp does.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rkc.ir.errors import FormatError, UnsupportedError

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # an SPM vocabulary's byte-fallback token

# tokenizer.ggml.pre -> the split regex llama.cpp uses for it (llama-vocab.cpp)
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
BPE_PRE_REGEX: dict[str, str] = {
    "qwen2": _QWEN2, "stablelm2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "smaug-bpe": _LLAMA3,
    "gpt-2": _GPT2, "default": _GPT2,
}


def spm_merges(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a normal piece, ranked by
    that piece's score (highest first), ties by id — llama.cpp's merge order."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (TOKEN_NORMAL, TOKEN_USER, TOKEN_UNUSED)}
    ranked = []
    for piece, i in vocab.items():
        if types[i] != TOKEN_NORMAL:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, vocab[left], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


@dataclass
class LlmTokenizer:
    hf: Any  # tokenizers.Tokenizer
    bos_id: int | None
    eos_ids: list[int]
    add_bos: bool
    chat_template: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # -- building --------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any], path: str = "model") -> "LlmTokenizer":
        """`fields`: GGUF key -> plain value (tokenizer arrays included)."""
        # deferred: the tokenizers library (a native extension) loads when a tokenizer is built
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

        kind = fields.get("tokenizer.ggml.model")
        tokens = list(fields.get("tokenizer.ggml.tokens") or [])
        if not tokens:
            raise FormatError(f"{path}: GGUF file has no tokenizer vocabulary")
        types = list(fields.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
        add_space = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        if kind == "llama":
            scores = list(fields.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
            vocab = {t: i for i, t in enumerate(tokens)}
            unk_id = fields.get("tokenizer.ggml.unknown_token_id")
            unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
            model = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, types), byte_fallback=True,
                               unk_token=unk, fuse_unk=True, ignore_merges=False)
            tok = Tokenizer(model)
            norms = [normalizers.Prepend("\u2581")] if add_space else []
            tok.normalizer = normalizers.Sequence([*norms, normalizers.Replace(" ", "\u2581")])
            decs = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            if add_space:
                decs.append(decoders.Strip(" ", 1, 0))
            tok.decoder = decoders.Sequence(decs)
        elif kind == "gpt2":
            pre = fields.get("tokenizer.ggml.pre", "default")
            if pre not in BPE_PRE_REGEX:
                raise UnsupportedError(f"{path}: BPE pre-tokenizer {pre!r} is not supported "
                                       f"(supported: {', '.join(sorted(BPE_PRE_REGEX))})")
            merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
            model = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=False)
            tok = Tokenizer(model)

            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(BPE_PRE_REGEX[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
            tok.decoder = decoders.ByteLevel()
        else:
            raise UnsupportedError(f"{path}: tokenizer model {kind!r} is not supported (supported: llama, gpt2)")
        added = []
        for i, (t, ty) in enumerate(zip(tokens, types)):
            if ty == TOKEN_CONTROL:
                added.append(AddedToken(t, special=True, normalized=False))
            elif ty == TOKEN_USER:
                added.append(AddedToken(t, special=False, normalized=False))
        tok.add_tokens(added)
        first_id: dict[str, int] = {}  # each piece's first id (tokens.index per piece is quadratic)
        for i, t in enumerate(tokens):
            first_id.setdefault(t, i)
        for a in added:  # added tokens must keep their vocabulary ids
            if tok.token_to_id(a.content) != first_id[a.content]:
                raise FormatError(f"{path}: token {a.content!r} is listed twice in the vocabulary")
        bos = fields.get("tokenizer.ggml.bos_token_id")
        eos = fields.get("tokenizer.ggml.eos_token_id")
        eos_ids = [int(eos)] if eos is not None else []
        eot = fields.get("tokenizer.ggml.eot_token_id")
        if eot is not None and int(eot) not in eos_ids:
            eos_ids.append(int(eot))
        for name in ("<end_of_turn>", "<|im_end|>", "<|eot_id|>"):  # end-of-turn markers stop generation too
            if name in first_id and first_id[name] not in eos_ids:
                eos_ids.append(first_id[name])
        default_bos = kind == "llama"
        return cls(hf=tok, bos_id=int(bos) if bos is not None else None, eos_ids=eos_ids,
                   add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", default_bos)) and bos is not None,
                   chat_template=fields.get("tokenizer.chat_template"))

    @classmethod
    def from_gguf(cls, path: str) -> "LlmTokenizer":
        import gguf  # deferred: a heavy library, for the compiler's reading of a GGUF only

        try:
            reader = gguf.GGUFReader(path)
        except Exception as exc:
            raise FormatError(f"{path}: truncated or corrupt GGUF ({type(exc).__name__}: {exc})") from None
        fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
        return cls.from_gguf_fields(fields, path)

    # -- (de)serialisation: the rkbin carries the tokenizer as JSON ------------------
    def to_json(self) -> str:
        return json.dumps({"hf": self.hf.to_str(), "bos_id": self.bos_id, "eos_ids": self.eos_ids,
                           "add_bos": self.add_bos, "chat_template": self.chat_template})

    @classmethod
    def from_json(cls, text: str) -> "LlmTokenizer":
        from tokenizers import Tokenizer  # deferred, as in from_gguf_fields

        try:
            d = json.loads(text)
            return cls(Tokenizer.from_str(d["hf"]), d["bos_id"], list(d["eos_ids"]), bool(d["add_bos"]),
                       d.get("chat_template"))
        except (ValueError, KeyError, TypeError, Exception) as exc:
            raise FormatError(f"corrupt tokenizer description ({type(exc).__name__})") from None

    # -- use ----------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Token ids; BOS first when the model asks for it. `special`: parse
        control tokens written in the text (llama.cpp's parse_special)."""
        self.hf.encode_special_tokens = not special
        ids = self.hf.encode(text, add_special_tokens=False).ids if text else []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def token_piece(self, token: int) -> tuple[str, list[int]]:
        """One token's own text and bytes, as an API's logprobs show them: a
        token holding part of a character shows its bytes as text
        ("bytes:\\xe2\\x80", as OpenAI's do)."""
        data = self._token_bytes(token)
        try:
            return data.decode("utf-8"), list(data)
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data), list(data)

    def _token_bytes(self, token: int) -> bytes:
        raw = self.hf.id_to_token(token) or ""
        if token in self.hf.get_added_tokens_decoder():  # control and user tokens: as written
            return raw.encode("utf-8")
        if type(self.hf.decoder).__name__ == "ByteLevel":  # gpt2: each byte is one character of the vocabulary
            table = _byte_level_table()
            if all(c in table for c in raw):
                return bytes(table[c] for c in raw)
            return raw.encode("utf-8")
        byte = _BYTE_TOKEN.fullmatch(raw)  # llama (SentencePiece): byte-fallback tokens, U+2581 for spaces
        return bytes([int(byte.group(1), 16)]) if byte else raw.replace("\u2581", " ").encode("utf-8")

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)


@functools.cache
def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level vocabulary alphabet, character -> byte: the printable
    bytes (! to ~, U+00A1 to U+00AC, U+00AE to U+00FF) stand for themselves,
    the other 68 for U+0100 onwards in byte order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in set(kept)]
    return {**{chr(b): b for b in kept}, **{chr(0x100 + i): b for i, b in enumerate(moved)}}


class TextStream:
    """Turns a growing list of ids into text pieces to print: a piece is
    emitted once it no longer ends in an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer: LlmTokenizer) -> None:
        self.tok, self.ids, self.done = tokenizer, [], ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.done = text[len(self.done):], text
        return piece
