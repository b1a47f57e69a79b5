#!/usr/bin/env python3
"""Writes corpus.jsonl: the strings of the tokenizer golden test.

One JSON string per line. Hand-written cases per category, plus generated
variations (whitespace, digits, long words, mixed scripts) with a fixed seed,
so rerunning gives the same file:

    python3 tests/data/tokenizer/make_corpus.py

then regenerate the golden ids with make_golden.js (see there).

Deliberately absent (documented in docs/tokenizers.md): U+FEFF, U+0085,
U+180E, U+017F and U+212A, where the JavaScript port's regex (the golden
generator) and the Rust reference disagree, and code points assigned after
Unicode 14 (PCRE2 10.42's tables).
"""

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

PROSE = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "a",
    " ",
    "",
    "  leading spaces",
    "trailing spaces   ",
    "   both sides   ",
    "\tTabbed\tcolumns\tare\there",
    "Line one\nLine two\nLine three",
    "Windows\r\nline\r\nendings\r\n",
    "Old Mac\rline\rendings",
    "Trailing newline\n",
    "\n\nleading newlines",
    "Blank lines\n\n\nbetween paragraphs\n\n",
    "Mixed \t \n \r\n whitespace \u00a0 non-breaking",
    "Punctuation!!! ... ??? ;;; ::: --- ___ *** ###",
    "quotes: \"double\" 'single' `back` \u201ccurly\u201d \u2018curly\u2019",
    "Em dash \u2014 en dash \u2013 ellipsis \u2026 bullet \u2022",
    "e-mail: someone@example.com, url: https://example.org/a/b?c=d&e=f#g",
    "path: /usr/local/lib/python3.11/site-packages/__init__.py",
    "C:\\Users\\Admin\\Documents\\file (1).txt",
    "Mr. Smith's dog didn't bark; they're sure we've seen I'm fine, you'll see, he'd go.",
    "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D",
    "It'S doN'T thEy'Re wE'vE i'M yOu'Ll hE'd",
    "'s 't 're 've 'm 'll 'd",
    "rock'n'roll o'clock ma'am y'all",
    "the students' books and James' car",
    "'''triple''' \"\"\"quotes\"\"\"",
    "Don\u2019t use curly apostrophes\u2019s tokens",
    "snake_case_identifier camelCaseIdentifier PascalCase kebab-case SCREAMING_CASE",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "#hashtag @mention $dollar %percent ^caret &amp *star",
    "[brackets] {braces} (parens) <angles>",
    "semi;colon,comma.period?question!exclaim",
    "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS %$#",
    "x",
    "xx xx  xx   xx",
    "I",
    "I'm",
    "OK",
    "okay. OK. Okay! oK?",
]

NUMBERS = [
    "0",
    "1",
    "12",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "-42",
    "+7",
    "1,000,000",
    "1.000.000,50",
    "1e10 2.5E-3 6.022e23",
    "0x1F 0b1010 0o777",
    "2024-01-15T13:45:30Z",
    "Phone: +1 (555) 123-4567",
    "Version 3.11.4 and v2.0.0-rc.1",
    "100% of 50% is 50%",
    "$1,234.56 \u20ac99,99 \u00a3100 \u00a55000",
    "Room 101, Floor 7, Building 42B",
    "The year 1999 and 2000 and 2001.",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13",
    "\u2460\u2461\u2462 \u00bd \u00be \u2153",
    "IV XII MMXXIV \u2163 \u216b",
]

CJK = [
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\u3002",
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u673a\u5668\u5b66\u4e60\u662f\u4eba\u5de5\u667a\u80fd\u7684\u4e00\u4e2a\u5206\u652f\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u3072\u3089\u304c\u306a\u3068\u30ab\u30bf\u30ab\u30ca\u3068\u6f22\u5b57\u3002",
    "\u6771\u4eac\u90fd\u6e0b\u8c37\u533a",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
    "\u1100\u1161\u11a8",  # conjoining jamo: NFC composes to \uac01
    "\u4e2d\u6587English\u6df7\u5408text\u6d4b\u8bd5123",
    "\u300c\u5f15\u7528\u300d\u3010\u6807\u9898\u3011\u300a\u4e66\u540d\u300b",
    "\u5168\u89d2\uff21\uff22\uff23\uff41\uff42\uff43\uff01\uff1f",
    "\u4e00\u4e8c\u4e09\u56db\u4e94\u516d\u4e03\u516b\u4e5d\u5341\u767e\u5343\u4e07\u4ebf",
    "\u8fd9\u662f\u4e00\u4e2a\u975e\u5e38\u975e\u5e38\u975e\u5e38\u957f\u7684\u53e5\u5b50\uff0c\u6ca1\u6709\u4efb\u4f55\u7a7a\u683c\u6216\u8005\u6807\u70b9\u7b26\u53f7\u7528\u6765\u6d4b\u8bd5\u5206\u8bcd\u5668\u5bf9\u4e8e\u8d85\u957f\u8fde\u7eed\u6c49\u5b57\u7684\u5904\u7406\u662f\u5426\u6b63\u786e",
    "\U00020000\U0002a6d6",  # CJK Extension B
    "\uf900\uf901",  # CJK compatibility ideographs: NFC maps them
]

ACCENTS = [
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 co\u00f6perate",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",  # decomposed: NFC composes
    "\u00c5ngstr\u00f6m \u212bngstr\u00f6m A\u030angstro\u0308m",
    "\u2126 ohm vs \u03a9 omega",
    "Stra\u00dfe Gr\u00fc\u00dfe \u00c4rger \u00d6l \u00dcbel",
    "Z\u00fcrich Z\u00fc\u0308rich Zu\u0308rich",
    "fa\u00e7ade gar\u00e7on Fran\u00e7ais",
    "\u0105\u0119\u0142\u0144\u00f3\u015b\u017a\u017c \u0104\u0118\u0141\u0143\u00d3\u015a\u0179\u017b",
    "\u010d\u0161\u017e\u0107\u0111 \u010c\u0160\u017d\u0106\u0110",
    "\u1ea0\u1ea1\u1ea2\u1ea3 Vi\u1ec7t Nam ti\u1ebfng Vi\u1ec7t",
    "Vie\u0323\u0302t Nam",  # two marks in non-canonical order
    "q\u0307\u0323 x\u0301\u0301",  # marks with no precomposed form
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03bf",
    "\u03b1\u0301\u03b5\u0301\u03b7\u0301",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442, \u0451\u0436 \u0438 \u0439.",
    "\u0435\u0308\u0436 \u0438\u0306",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e \u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f",
    "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u0bae\u0bca\u0bb4\u0bbf",
    "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u0540\u0561\u0575\u0565\u0580\u0565\u0576",
    "\u00f1 n\u0303 \u00d1 N\u0303",
    "\u1e9b\u0323",  # long s with dot: NFC keeps the long s (no case tricks)
    "\u0041\u030a\u0301",
    "\ufb01 \ufb02 ligatures stay (NFC, not NFKC)",
    "\u00b2 \u00b3 \u00b9 superscripts and \u2082 subscripts",
]

RTL = [
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629 \u062c\u062f\u0627\u064b.",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u05e2\u05b4\u05d1\u05b0\u05e8\u05b4\u05d9\u05ea \u05e2\u05dd \u05e0\u05d9\u05e7\u05d5\u05d3",
    "English \u0645\u0639 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 mixed 123",
    "\u200f\u05e9\u05dc\u05d5\u05dd\u200e hello \u202bembedded\u202c",
    "\u0641\u0627\u0631\u0633\u06cc: \u0633\u0644\u0627\u0645 \u062f\u0646\u06cc\u0627 \u06f1\u06f2\u06f3",
    "\u0627\u064f\u0631\u062f\u064f\u0648 \u0632\u0628\u0627\u0646",
]

EMOJI = [
    "\U0001f600",
    "\U0001f600\U0001f603\U0001f604\U0001f601",
    "I love pizza \U0001f355 and tacos \U0001f32e!",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "\U0001f469\U0001f3fd\u200d\U0001f4bb coder",
    "\U0001f44d\U0001f3fb\U0001f44d\U0001f3fc\U0001f44d\U0001f3fd\U0001f44d\U0001f3fe\U0001f44d\U0001f3ff",
    "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f3f4\u200d\u2620\ufe0f",
    "\U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5 \U0001f1e8\U0001f1f3 flags",
    "\u2764\ufe0f \u2764 \u263a\ufe0f",
    "1\ufe0f\u20e3 #\ufe0f\u20e3 *\ufe0f\u20e3",
    "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1",
    "emoji\U0001f525in\U0001f525words",
    "\U0001f600 \U0001f600  \U0001f600   \U0001f600",
    "\u2603 \u2600 \u2601 \u2602 \u2614",
    "\U0001f40d Python \U0001f980 Rust \u2615 Java",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "import numpy as np\n\nx = np.arange(10)\nprint(x.sum())\n",
    "class Foo(Bar):\n    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n        self._x = None\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n",
    "#include <iostream>\n\nint main() {\n  std::cout << \"Hello\" << std::endl;\n  return 0;\n}\n",
    "template <typename T>\nstd::vector<T> Sorted(std::vector<T> v) {\n  std::sort(v.begin(), v.end());\n  return v;\n}",
    "fn main() {\n    let v: Vec<i32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }\nconsole.log(fib(10));",
    "const x = async () => { await fetch('/api/v1/items?limit=10'); };",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<html>\n  <body>\n    <div class=\"main\">Hi &amp; bye</div>\n  </body>\n</html>",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "key: value\nlist:\n  - one\n  - two\nnested:\n    deep: 1\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
    "    indented with four spaces\n        and eight\n            and twelve",
    "x=1;y=2;z=x+y;if(z>2){return z;}else{return -1;}",
    "a->b; c::d; e=>f; g<=h; i!=j; k==l; m&&n; o||p; q<<r; s>>t;",
    "public static void main(String[] args) { System.out.println(\"Hello\"); }",
    "  }\n}\n\n\n",
    "// comment\n/* block\n   comment */\n# python comment\n-- sql comment",
    "\"\"\"Docstring.\n\nArgs:\n    x: the input.\n\"\"\"",
    "regex = r'^(?:[a-z0-9!#$%&*+/=?^_`{|}~-]+)@example\\.com$'",
    "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-old\n+new\n",
    "Makefile:\nall:\n\t$(CC) -O2 -o main main.c\n",
    "%matplotlib inline\n!pip install torch==2.1.0",
]

MATH = [
    "$x^2 + y^2 = z^2$",
    "\\frac{a}{b} + \\sqrt{c} = \\int_0^\\infty e^{-x} dx",
    "\\begin{align}\nf(x) &= \\sum_{n=0}^{\\infty} \\frac{x^n}{n!} \\\\\n&= e^x\n\\end{align}",
    "\u2200x \u2208 \u211d, \u2203y: x < y \u2227 y \u2264 x + 1",
    "\u2211 \u220f \u222b \u221e \u2248 \u2260 \u2264 \u2265 \u00b1 \u00d7 \u00f7 \u221a \u2202 \u2207",
    "\u03b1 + \u03b2 = \u03b3, \u03bb\u2192\u221e, \u03c0 \u2248 3.14",
    "E = mc^2; F = ma; PV = nRT",
    "\\boxed{42}",
    "The answer is $\\boxed{\\frac{3}{4}}$.",
    "Let $f(x) = 3x^2 - 2x + 1$. Then $f'(x) = 6x - 2$.",
    "(a + b)^2 = a^2 + 2ab + b^2",
    "$$\\lim_{n \\to \\infty} \\left(1 + \\frac{1}{n}\\right)^n = e$$",
    "\\mathbb{R}^n \\times \\mathbb{C}^{m \\times n}",
    "1/2 + 1/3 = 5/6",
    "2 * (3 + 4) - 5 / 6 = 13.1666...",
]

GSM8K = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her parents. How much more money does Betty need to buy the wallet?",
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
    "Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?",
    "Question: If a train travels 60 miles per hour for 2.5 hours, how far does it go?\nAnswer: 60 * 2.5 = 150 miles. The answer is 150.",
    "Step 1: 15 + 27 = 42\nStep 2: 42 \u00d7 3 = 126\nStep 3: 126 \u2212 6 = 120\nFinal answer: 120",
]

CHAT = [
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\n<think>\nLet me think step by step.\n</think>\n\nThe answer is 4.<|im_end|>\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|endoftext|><|endoftext|><|endoftext|>",
    "<think>",
    "<think></think>",
    "</think>",
    "<think>\n\n</think>\n\n",
    "<|im_start|><|im_end|>",
    "<|im_start|",
    "<|im_end",
    "<|im_start|>>",
    "<<|im_start|>",
    "< |im_start| >",
    "<|IM_START|>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<tool_response>\n{\"temp\": 21}\n</tool_response>",
    "<|fim_prefix|>def f(x):\n<|fim_suffix|>\n    return y<|fim_middle|>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|object_ref_start|>the cat<|object_ref_end|><|box_start|>(10,20),(30,40)<|box_end|>",
    " <|im_start|> spaced <|im_end|> ",
    "\n<|im_end|>\n",
    "caf\u00e9<|im_end|>cafe\u0301",
    "<|repo_name|>fusionrl<|file_sep|>src/main.cc",
    "<|im_start|>user\n\u4f60\u597d\uff01\U0001f600<|im_end|>",
    "<|quad_start|><|quad_end|><|video_pad|><|fim_pad|>",
]


def generated(rng):
    out = []
    # Whitespace runs of every kind before and after words.
    for ws in [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n",
               " \n", "\n ", "  \n  ", "\u3000", "\u00a0", "\u2003", " \t "]:
        out.append(f"word{ws}word")
        out.append(f"{ws}start")
        out.append(f"end{ws}")
        out.append(f"x{ws * 7}y")
    # Digit runs of many lengths (Qwen splits every digit).
    for n in [5, 16, 33, 64, 100, 257]:
        out.append("".join(rng.choice("0123456789") for _ in range(n)))
    # Long words and repeated characters (the heap merge path).
    for n in [50, 100, 300, 1000]:
        out.append("a" * n)
        out.append("ab" * (n // 2))
        out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                           for _ in range(n)))
    out.append("=" * 80)
    out.append("-" * 200)
    out.append(" " * 100)
    out.append("\n" * 50)
    out.append("\u4e00" * 120)
    out.append("\U0001f600" * 60)
    out.append("!" * 33 + "?" * 33)
    # Random mixtures drawn from the hand-written strings.
    pool = PROSE + NUMBERS + CJK + ACCENTS + RTL + EMOJI + CODE + MATH
    for _ in range(60):
        k = rng.randint(2, 4)
        parts = [rng.choice(pool) for _ in range(k)]
        sep = rng.choice([" ", "\n", "", "  ", "\t", "\r\n", " - "])
        out.append(sep.join(parts))
    # Random characters from assorted blocks, to shake out regex classes.
    blocks = [(0x20, 0x7E), (0xA0, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF),
              (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0x3040, 0x30FF),
              (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x2000, 0x206F),
              (0x2190, 0x22FF), (0x1F300, 0x1F5FF), (0xFF00, 0xFF5E)]
    excluded = {0x85, 0x17F, 0x180E, 0x212A, 0xFEFF}
    for _ in range(40):
        chars = []
        for _ in range(rng.randint(5, 40)):
            lo, hi = rng.choice(blocks)
            cp = rng.randint(lo, hi)
            if cp in excluded or 0xD800 <= cp <= 0xDFFF:
                continue
            ch = chr(cp)
            # Skip unassigned / private code points (tables differ).
            import unicodedata
            if unicodedata.category(ch) in ("Cn", "Co", "Cs"):
                continue
            chars.append(ch)
        out.append("".join(chars))
    return out


def main():
    rng = random.Random(20240615)
    corpus = (PROSE + NUMBERS + CJK + ACCENTS + RTL + EMOJI + CODE + MATH +
              GSM8K + CHAT + generated(rng))
    seen = set()
    unique = []
    for s in corpus:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    path = os.path.join(HERE, "corpus.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for s in unique:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"wrote {len(unique)} strings to {path}")


if __name__ == "__main__":
    main()
