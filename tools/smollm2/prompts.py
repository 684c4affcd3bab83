"""Prompts for SmolLM2's draft: code tasks drawn from the Python standard library and English
instructions from topics x templates. Split by source (file or topic), so that no held-out prompt
shares a file or a topic with a training prompt.
"""
from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
import textwrap
from pathlib import Path

TOPICS = """photosynthesis|the water cycle|black holes|the French Revolution|the Roman Empire|volcanoes|
climate change|the human heart|vaccines|the immune system|electric cars|solar power|wind energy|
the stock market|inflation|compound interest|budgeting|saving for retirement|learning a new language|
public speaking|time management|remote work|job interviews|writing a resume|healthy sleep|meditation|
running a marathon|yoga|strength training|a balanced diet|vegetarian cooking|baking bread|making pasta|
coffee|tea|chocolate|honey bees|dolphins|elephants|penguins|cats|dogs|houseplants|gardening|composting|
recycling|plastic pollution|the ocean|coral reefs|rainforests|deserts|the Arctic|earthquakes|hurricanes|
the Moon|Mars|the Sun|the solar system|satellites|the International Space Station|telescopes|gravity|
electricity|magnetism|light|sound|atoms|DNA|evolution|dinosaurs|fossils|the printing press|
the Industrial Revolution|ancient Egypt|the Great Wall of China|the Renaissance|Shakespeare|poetry|
jazz|classical music|learning the guitar|painting|photography|film making|video games|chess|soccer|
basketball|the Olympic Games|cycling|hiking|camping|travelling on a budget|Japan|Italy|Brazil|Canada|
Kenya|India|Australia|Paris|London|New York|the internet|email etiquette|password security|
phishing|cloud computing|artificial intelligence|machine learning|robots|3D printing|smartphones|
open source software|databases|version control with git|the Linux command line|web browsers|HTML|
CSS|JavaScript|Python|recursion|sorting algorithms|binary search|hash tables|linked lists|
unit testing|debugging|code review|APIs|JSON|regular expressions|spreadsheets|statistics|probability|
fractions|prime numbers|geometry|the Pythagorean theorem|algebra|calculus|renting an apartment|
buying a used car|moving to a new city|making friends|parenting|teaching children to read|libraries|
museums|volunteering|recycling electronics|first aid|fire safety|drinking water|bicycles|trains|
airplanes|ships|bridges|skyscrapers|electric grids|batteries|nuclear energy|weather forecasts|rainbows|
snow|tides|maps|the compass|the calendar|clocks|money|banks|taxes|small businesses|marketing|
customer service|negotiation|leadership|teamwork|giving feedback|note taking|studying for exams|
reading more books|writing a story|keeping a journal|minimalism|cleaning a kitchen|laundry|
organizing a closet|planning a birthday party|wedding speeches|thank-you notes|apologizing|
dealing with stress|procrastination|motivation|habits|kindness|gratitude"""

ENGLISH_TEMPLATES = [
    "Explain {t} to a beginner.", "Write a short paragraph about {t}.", "What are three interesting facts "
    "about {t}?", "Give me five tips about {t}.", "Summarize what someone should know about {t} in a few "
    "sentences.", "Write a short poem about {t}.", "What are the advantages and disadvantages of {t}?",
    "Explain {t} to a ten-year-old.", "Write a list of questions a student might ask about {t}.",
    "Describe {t} in simple words.", "Why is {t} important?", "Write a short blog post introduction "
    "about {t}.", "What is a common misconception about {t}?", "Write a tweet about {t}.",
    "Give an example that helps explain {t}.", "How would you teach {t} in a one-hour class?",
]

GENERAL = """Write an email to my manager asking for a day off next Friday.|Write a polite message declining a
meeting invitation.|Give me a recipe for a quick vegetarian dinner.|Suggest a name for a bakery.|Write a
haiku about autumn.|Tell me a joke about computers.|Write a short story about a robot who learns to paint.|
Translate 'good morning, how are you?' into French and Spanish.|What should I pack for a weekend trip to
the mountains?|Write a thank-you note to a teacher.|Give me a workout plan for beginners.|How do I boil an
egg?|Write a product description for a reusable water bottle.|Plan a three-day trip to Rome.|What is the
difference between weather and climate?|Rewrite this sentence to be more formal: 'hey, can u send me the
file asap?'|Give me ideas for a science fair project.|Write a limerick about a cat.|What are some good habits
for studying?|Write a short speech for a friend's birthday.|List five ways to save energy at home.|Write a
cover letter opening for a junior developer job.|Explain the rules of tic-tac-toe.|How can I improve my
handwriting?|Write a dialogue between a customer and a waiter.|Suggest three books for someone who likes
science fiction.|What is the capital of Australia, and what is it known for?|Write instructions for making
a paper airplane.|How do I politely ask my neighbor to turn down the music?|Give me a packing list for a
beach holiday.|Write a short motivational message for a friend before an exam.|Describe a sunset at the
beach.|What questions should I ask when adopting a dog?|Write an out-of-office reply.|How do I start a
vegetable garden on a balcony?|Write a riddle and give its answer.|Summarize the plot of Romeo and Juliet.|
What is a healthy breakfast?|Write a short review of a fictional restaurant.|How can I be more productive in
the morning?|Convert 5 kilometers to miles and explain how.|What is 15 percent of 80? Show the steps.|Explain
how to calculate the area of a circle.|Write a to-do list for moving house.|Give me three ideas for a
rainy day with kids.""".replace("\n", " ")

CODE_TEMPLATES = [
    "Write a Python function `{sig}` that {doc}", "Implement `{sig}` in Python. It should {doc_lc}",
    "Can you write Python code for `{sig}`? {doc}", "Write a Python function named `{name}` that {doc_lc}",
]
EXPLAIN_TEMPLATES = [
    "Explain what this Python function does:\n```python\n{src}\n```",
    "Add a docstring and comments to this Python code:\n```python\n{src}\n```",
    "Is there a bug in this Python function? Explain.\n```python\n{src}\n```",
    "Write unit tests for this function:\n```python\n{src}\n```",
]
GENERIC_CODE = """Write a Python function that checks whether a number is prime.|Write a function that reverses a
string in Python.|Write a Python class for a bank account with deposit and withdraw methods.|Write a Python
script that counts the words in a text file.|Write a JavaScript function that returns the largest number in
an array.|Write a SQL query that selects the ten most recent orders.|Write a Python function that merges two
sorted lists.|Write a bash command that finds all .txt files in a folder.|Write a Python function to compute
the Fibonacci numbers up to n.|Write a function that checks whether a string is a palindrome.|Write a Python
function that removes duplicates from a list while keeping the order.|Write a Python function that returns
the n most common words in a string.|Write a binary search in Python.|Write a Python function that flattens
a nested list.|Write a Python decorator that times a function.|Write a Python function that validates an
email address with a regular expression.|Write a Python function that converts Celsius to Fahrenheit.|
Write a Python generator that yields prime numbers.|Write a Python function that reads a CSV file and
returns the rows as dictionaries.|Write a function that computes the factorial of a number recursively.|
Write a Python function that checks whether two strings are anagrams.|Write a stack class in Python.|Write
a Python function that sorts a list of dictionaries by a key.|Write a C function that swaps two integers.|
Write a Python function that returns the second largest number in a list.|Write a Python function that
counts the vowels in a string.|Write an HTML page with a form that has a name field and a submit button.|
Write a Python function that computes the greatest common divisor of two numbers.|Write a Python function
that checks whether a year is a leap year.|Write a Python function that transposes a matrix.""".replace(
    "\n", " ")


def held_out(key: str, every: int = 10) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % every == 0


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.replace("\n", "").split("|") if s.strip()]


def _functions(path: Path) -> list[tuple[str, str, str, int]]:
    """(signature, docstring summary, source, lines up to the docstring's end) of the documented functions of one module."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        doc = ast.get_docstring(node)
        seg = ast.get_source_segment(source, node, padded=True)
        if not doc or not seg or not 3 <= seg.count("\n") <= 40:
            continue
        summary = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
        if not 20 <= len(summary) <= 200:
            continue
        args = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
        seg = textwrap.dedent(seg)
        doc_end = node.body[0].end_lineno - node.lineno + 1
        out.append((f"{node.name}({', '.join(args)})", summary, seg, doc_end))
    return out


def code_files() -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "site-packages", "lib2to3", "ensurepip", "turtledemo", "config-")
    return sorted(p for p in lib.rglob("*.py") if not any(part.startswith(skip) for part in p.relative_to(lib).parts))


def build(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(training prompts, held-out prompts), each a list of {"prompt", "kind", "chat", "source"}."""
    rng = random.Random(seed)
    train, held = [], []

    def add(item: dict, key: str) -> None:
        (held if held_out(key) else train).append(item)

    lib = Path(sysconfig.get_paths()["stdlib"])
    for path in code_files():
        rel = str(path.relative_to(lib))
        for sig, doc, src, doc_end in _functions(path):
            doc = doc if doc.endswith(".") else doc + "."
            fill = {"sig": sig, "name": sig.split("(")[0], "doc": doc[0].upper() + doc[1:],
                    "doc_lc": doc[0].lower() + doc[1:], "src": src}
            tmpl = rng.choice(CODE_TEMPLATES + EXPLAIN_TEMPLATES[:1] * 2 + EXPLAIN_TEMPLATES[1:])
            add({"prompt": tmpl.format(**fill), "kind": "code-instruction", "chat": True, "source": rel}, rel)
            opening = "\n".join(src.split("\n")[:doc_end]) + "\n"
            if rng.random() < 0.35:      # the instruct model is mostly asked in chat
                add({"prompt": opening, "kind": "code-completion", "chat": False, "source": rel}, rel)
    for topic in _split(TOPICS):
        for tmpl in rng.sample(ENGLISH_TEMPLATES, 12):
            add({"prompt": tmpl.format(t=topic), "kind": "instruction", "chat": True, "source": topic}, topic)
    for i, text in enumerate(_split(GENERAL)):
        add({"prompt": text, "kind": "instruction", "chat": True, "source": f"general-{i}"}, text)
    for i, text in enumerate(_split(GENERIC_CODE)):
        add({"prompt": text, "kind": "code-instruction", "chat": True, "source": f"generic-{i}"}, text)
    rng.shuffle(train)
    return train, held


def held_out_set(held: list[dict], seed: int = 0) -> list[dict]:
    """A balanced evaluation set from the held-out prompts: 24 code instructions, 16 code openings,
    24 English instructions (64 in all)."""
    rng = random.Random(seed)
    want = {"code-instruction": 24, "code-completion": 16, "instruction": 24}
    out = []
    for kind, n in want.items():
        pool = [h for h in held if h["kind"] == kind]
        out += rng.sample(pool, min(n, len(pool)))
    return out
