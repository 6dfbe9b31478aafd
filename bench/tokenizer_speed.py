#!/usr/bin/env python3
"""bench/tokenizer_speed.py: kvguard's tokenizer against llama.cpp's `llama-tokenize`, side by side.

For each vocabulary (llama.cpp's ggml-vocab-NAME.gguf) both programs tokenize the same 1 MiB of
mixed text (Vim's tutor in its translations, ~30 languages and scripts, then this repository's
Markdown and C++) and a 1-byte text, alternating A B A B ...; the rate is
1 MiB / (median time of the 1 MiB run - median time of the 1-byte run), i.e. tokenization
without loading the vocabulary or starting the process. Both run with an unlimited stack
(llama.cpp's std::regex needs it for 1 MiB). The ids of the 1 MiB run are compared.

usage: bench/tokenizer_speed.py --kvguard build/default/tools/kvguard \
           --llama-tokenize /path/to/llama.cpp/build/bin/llama-tokenize \
           --vocabs ~/.cache/kvguard/llama-vocabs [--rounds 3] [NAME ...]
"""
import argparse
import ast
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20


def corpus(repo):
    """Returns 1 MiB of mixed text, cut at a character boundary and padded with spaces."""
    parts = []
    for path in sorted(glob.glob("/usr/share/vim/vim90/tutor/tutor*.utf-8")):
        with open(path, encoding="utf-8") as f:
            parts.append(f.read()[:9000])
    for pattern in ("*.md", "*/*.md", "core/*/*.cc", "core/*/*.h", "tools/*.cc"):
        for path in sorted(glob.glob(os.path.join(repo, pattern))):
            with open(path, encoding="utf-8") as f:
                parts.append(f.read())
    data = "\n".join(parts).encode("utf-8")[:MIB].decode("utf-8", errors="ignore")
    data = data.encode("utf-8")
    return data + b" " * (MIB - len(data))


def unlimited_stack():
    # llama.cpp's std::regex recurses per character matched: 1 MiB overflows an 8 MiB stack.
    resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def run(cmd):
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, preexec_fn=unlimited_stack).stdout
    return time.perf_counter() - start, out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvguard", required=True)
    p.add_argument("--llama-tokenize", required=True)
    p.add_argument("--vocabs", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("names", nargs="*", default=["llama-bpe", "qwen2", "gpt-2", "llama-spm"])
    a = p.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp()
    big, small = os.path.join(tmp, "mixed.txt"), os.path.join(tmp, "one.txt")
    with open(big, "wb") as f:
        f.write(corpus(repo))
    with open(small, "wb") as f:
        f.write(b"a")
    print("| vocabulary | tokens | kvguard MB/s | llama-tokenize MB/s | ratio | ids equal |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name in a.names:
        vocab = os.path.join(a.vocabs, f"ggml-vocab-{name}.gguf")
        kv = lambda text: [a.kvguard, "model", "tokenize", vocab, "--no-bos", "--file", text]
        ll = lambda text: [a.llama_tokenize, "-m", vocab, "-f", text, "--ids", "--no-bos",
                           "--no-escape", "--no-parse-special", "--log-disable"]
        times = {("kv", big): [], ("kv", small): [], ("ll", big): [], ("ll", small): []}
        ids = {}
        for _ in range(a.rounds):  # A B A B ...
            for text in (big, small):
                for who, cmd in (("kv", kv), ("ll", ll)):
                    t, out = run(cmd(text))
                    times[(who, text)].append(t)
                    if text == big:
                        ids[who] = (json.loads(out) if who == "kv"
                                    else ast.literal_eval(out.decode().strip().splitlines()[-1]))
        rate = {}
        for who in ("kv", "ll"):
            dt = statistics.median(times[(who, big)]) - statistics.median(times[(who, small)])
            rate[who] = MIB / 1e6 / dt
        print(f"| {name} | {len(ids['kv'])} | {rate['kv']:.1f} | {rate['ll']:.1f} | "
              f"{rate['kv'] / rate['ll']:.2f}x | {'yes' if ids['kv'] == ids['ll'] else 'NO'} |")
        sys.stdout.flush()
        for who in ("kv", "ll"):
            print(f"<!-- {name} {who}: 1 MiB runs {['%.3f' % t for t in times[(who, big)]]} s, "
                  f"1-byte runs {['%.3f' % t for t in times[(who, small)]]} s -->")


if __name__ == "__main__":
    main()
