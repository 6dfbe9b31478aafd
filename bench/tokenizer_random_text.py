#!/usr/bin/env python3
"""bench/tokenizer_random_text.py SEED OUT: ~250 KB of random text for comparing tokenizers
(bench/results/tokenizers.md): 1500 lines, each a run of short draws from pools of ASCII, Latin,
Greek, Cyrillic, Arabic, Devanagari, CJK and Hangul, full-width forms, emoji, every kind of
whitespace and format character, and code points drawn anywhere up to U+30000 (unassigned ones
included). Surrogates are left out (no UTF-8 for them)."""
import random
import sys


def main():
    seed, out = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(seed)
    ranges = [(0x20, 0x7F), (0xA0, 0x250), (0x370, 0x530), (0x600, 0x700), (0x900, 0x980),
              (0x2000, 0x2070), (0x3000, 0x3100), (0x4E00, 0x4F00), (0xAC00, 0xAC80),
              (0xFF00, 0xFFF0), (0x10000, 0x10100), (0x1F300, 0x1F700)]
    pools = [list(" \t\n\r'sSdtTmMlLrevV")] + [[chr(c) for c in range(a, b)] for a, b in ranges]
    pools.append(list("\u0085\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\u200b"
                      "\u200d\ufeff\u180e"))
    pools.append([chr(c) for c in (rng.randrange(0x80, 0x30000) for _ in range(3000))
                  if not 0xD800 <= c < 0xE000])
    lines = []
    for _ in range(1500):
        parts = []
        for _ in range(rng.randrange(1, 40)):
            pool = rng.choice(pools)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 6))))
        lines.append("".join(parts))
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
