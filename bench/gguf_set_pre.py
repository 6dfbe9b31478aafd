#!/usr/bin/env python3
"""bench/gguf_set_pre.py SRC.gguf DST.gguf PRE: copies a vocabulary-only GGUF with
tokenizer.ggml.pre set to PRE, to compare kvguard and llama.cpp on pre-tokenizers llama.cpp's
suite has no vocabulary for (bench/results/tokenizers.md). Needs gguf-py (scripts/requirements.txt
via .venv). Files with tensors are refused."""
import sys

import gguf


def main():
    src, dst, pre = sys.argv[1:4]
    r = gguf.GGUFReader(src)
    if len(r.tensors):
        sys.exit(f"{src}: has tensors; this copies vocabulary-only files")
    w = gguf.GGUFWriter(dst, bytes(r.fields["general.architecture"].parts[-1]).decode())
    w.add_string("tokenizer.ggml.pre", pre)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "tokenizer.ggml.pre"):
            continue
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            values = [bytes(f.parts[i]) if sub == gguf.GGUFValueType.STRING else f.parts[i][0].item()
                      for i in f.data]
            w.add_key_value(name, values, kind, sub_type=sub)
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode("utf-8"))
        else:
            w.add_key_value(name, f.parts[-1][0].item(), kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


if __name__ == "__main__":
    main()
