#!/usr/bin/env python3
"""bench/make_gguf.py: a random-weight Llama GGUF of a built-in model's shape, for side-by-side
runs with another engine (llama.cpp) on the same weights.

The shape is one of kvguard's built-in models (`kvguard model inspect` on the output shows it;
the figures below mirror core/model/model_config.cc, BuiltinConfig). The tokenizer is copied
from another GGUF file (--vocab), e.g. llama.cpp's SentencePiece test vocabulary
`models/ggml-vocab-llama-spm.gguf` (32000 tokens, as `small` and `medium` have). Weights are
drawn N(0, 0.02^2) with unit norms, written as F16 (or F32); llama.cpp's `llama-quantize` makes
its Q4_0 from the same file. Written with llama.cpp's GGUF writer (the PyPI package `gguf`,
pinned in scripts/requirements.txt).

  .venv/bin/python bench/make_gguf.py --shape small \\
      --vocab /tmp/llama.cpp/models/ggml-vocab-llama-spm.gguf --out /tmp/small-f16.gguf
"""

import argparse
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

# dim, layers, heads, kv heads, head dim, ffn, vocab, context (core/model/model_config.cc).
SHAPES = {
    "small": dict(dim=768, layers=12, heads=12, kv_heads=12, head_dim=64, ffn=2048, vocab=32000,
                  context=4096),
    "medium": dict(dim=2048, layers=22, heads=32, kv_heads=4, head_dim=64, ffn=5632, vocab=32000,
                   context=4096),
}
ROPE_THETA = 10000.0
RMS_EPS = 1e-5

# Tokenizer keys copied from --vocab, with their value types.
VOCAB_ARRAYS = {"tokenizer.ggml.tokens": GGUFValueType.STRING,
                "tokenizer.ggml.scores": GGUFValueType.FLOAT32,
                "tokenizer.ggml.token_type": GGUFValueType.INT32}
VOCAB_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
             "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id")
VOCAB_BOOLS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")


def field_value(field):
    """The scalar or array value of a GGUFReader field."""
    if field.types[0] == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i][0].item() for i in field.data]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]][0].item()


def copy_vocab(path, writer, vocab_size):
    reader = GGUFReader(path)
    model = field_value(reader.fields["tokenizer.ggml.model"])
    tokens = field_value(reader.fields["tokenizer.ggml.tokens"])
    if len(tokens) != vocab_size:
        sys.exit(f"make_gguf: {path} has {len(tokens)} tokens; the shape needs {vocab_size}")
    writer.add_tokenizer_model(model)
    for key, vtype in VOCAB_ARRAYS.items():
        if key in reader.fields:
            writer.add_array(key, field_value(reader.fields[key]))
    for key in VOCAB_IDS:
        if key in reader.fields:
            writer.add_uint32(key, int(field_value(reader.fields[key])))
    for key in VOCAB_BOOLS:
        if key in reader.fields:
            writer.add_bool(key, bool(field_value(reader.fields[key])))
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--vocab", required=True, help="a GGUF file whose tokenizer is copied")
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", choices=("f16", "f32"), default="f16")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    rng = np.random.default_rng(args.seed)
    dtype = np.float16 if args.type == "f16" else np.float32

    w = GGUFWriter(args.out, "llama")
    w.add_name(f"kvguard-{args.shape}-random")
    w.add_context_length(s["context"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_file_type(1 if args.type == "f16" else 0)
    tokenizer = copy_vocab(args.vocab, w, s["vocab"])

    def matrix(rows, cols):  # [rows, cols]: GGUF ne = [cols, rows]
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(dtype)

    def norm(n):  # norms stay F32, as llama.cpp's converters write them
        return np.ones(n, dtype=np.float32)

    d, hd = s["dim"], s["head_dim"]
    w.add_tensor("token_embd.weight", matrix(s["vocab"], d))
    for layer in range(s["layers"]):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", norm(d))
        w.add_tensor(p + "attn_q.weight", matrix(s["heads"] * hd, d))
        w.add_tensor(p + "attn_k.weight", matrix(s["kv_heads"] * hd, d))
        w.add_tensor(p + "attn_v.weight", matrix(s["kv_heads"] * hd, d))
        w.add_tensor(p + "attn_output.weight", matrix(d, s["heads"] * hd))
        w.add_tensor(p + "ffn_norm.weight", norm(d))
        w.add_tensor(p + "ffn_gate.weight", matrix(s["ffn"], d))
        w.add_tensor(p + "ffn_up.weight", matrix(s["ffn"], d))
        w.add_tensor(p + "ffn_down.weight", matrix(d, s["ffn"]))
    w.add_tensor("output_norm.weight", norm(d))
    w.add_tensor("output.weight", matrix(s["vocab"], d))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"make_gguf: wrote {args.out}: {args.shape} shape, {args.type.upper()} weights, "
          f"tokenizer '{tokenizer}' from {args.vocab}")


if __name__ == "__main__":
    main()
