"""Writes mc_demo: Gym's own multiple-choice evaluation task, in MMLU's layout, with a known answer key.

Five subjects (arithmetic, chemistry, english, geography, units), 60 test questions each, 5 dev questions each
for n-shot prompts, and a train split (as alpaca rows that answer with the letter, the prompt `gym eval` uses)
to fine-tune on. Every question is generated here from facts and arithmetic we check, with three wrong
choices that are wrong by construction; the right letter is spread evenly over A-D.

    python data/make_mc_demo.py
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from make_demo_data import CAPITALS, ELEMENTS

HERE = Path(__file__).parent
LETTERS = "ABCD"
Question = tuple[str, str, list[str]]  # question, right answer, wrong answers

OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("happy", "sad"), ("open", "closed"), ("early", "late"),
    ("full", "empty"), ("hard", "soft"), ("high", "low"), ("long", "short"), ("rich", "poor"), ("strong", "weak"),
    ("wet", "dry"), ("thick", "thin"), ("loud", "quiet"), ("push", "pull"), ("day", "night"), ("left", "right"),
    ("true", "false"), ("inside", "outside"), ("clean", "dirty"), ("cheap", "expensive"), ("heavy", "light"),
    ("old", "young"), ("up", "down"), ("win", "lose"), ("buy", "sell"), ("first", "last"), ("friend", "enemy"),
    ("question", "answer"), ("arrive", "leave"), ("ancient", "modern"), ("top", "bottom"), ("remember", "forget"),
    ("sweet", "sour"), ("wide", "narrow"), ("near", "far"), ("asleep", "awake"),
]
WORDS = ["garden", "window", "planet", "river", "silver", "pencil", "rocket", "candle", "forest", "bridge", "orange",
         "castle", "butter", "marble", "violin", "dragon", "meadow", "harbor", "lantern", "thunder", "apple", "zebra",
         "cloud", "mountain", "ocean", "tiger", "kitchen", "island", "yellow", "basket", "music", "engine"]
UNITS = [("centimeters", "meters", 100), ("meters", "kilometers", 1000), ("grams", "kilograms", 1000),
         ("minutes", "hours", 60), ("seconds", "minutes", 60), ("hours", "days", 24), ("days", "weeks", 7),
         ("milliliters", "liters", 1000), ("months", "years", 12), ("eggs", "dozens of eggs", 12)]
CONTINENTS = sorted({c for _, _, c in CAPITALS})


def _numbers_near(r: random.Random, right: int, count: int = 3) -> list[str]:
    wrong: set[int] = set()
    while len(wrong) < count:
        candidate = right + r.choice([-1, 1]) * r.choice([1, 2, 3, 4, 5, 10, 11, 20])
        if candidate != right and candidate >= 0:
            wrong.add(candidate)
    return [str(w) for w in sorted(wrong)]


def arithmetic(r: random.Random) -> Question:
    op = r.choice("+-x")
    if op == "+":
        a, b = r.randint(10, 99), r.randint(10, 99)
        right = a + b
    elif op == "-":
        a, b = sorted((r.randint(10, 99), r.randint(10, 99)), reverse=True)
        right = a - b
    else:
        a, b = r.randint(2, 12), r.randint(2, 12)
        right = a * b
    sign = {"+": "+", "-": "-", "x": "×"}[op]
    return f"What is {a} {sign} {b}?", str(right), _numbers_near(r, right)


def units(r: random.Random) -> Question:
    small, large, factor = r.choice(UNITS)
    value = r.randint(2, 9)
    right = value * factor
    wrong = {value * f for f in (10, 100, 1000, 60, 24, 7, 12) if f != factor} - {right}
    return (f"How many {small} are in {value} {large}?", str(right),
            [str(w) for w in sorted(r.sample(sorted(wrong), 3))])


def geography(r: random.Random) -> Question:
    country, capital, continent = r.choice(CAPITALS)
    kind = r.randrange(3)
    if kind == 0:
        return (f"What is the capital of {country}?", capital,
                r.sample([c for _, c, _ in CAPITALS if c != capital], 3))
    if kind == 1:
        return (f"Which country has {capital} as its capital?", country,
                r.sample([c for c, _, _ in CAPITALS if c != country], 3))
    return f"On which continent is {country}?", continent, r.sample([c for c in CONTINENTS if c != continent], 3)


def chemistry(r: random.Random) -> Question:
    name, symbol, number = r.choice(ELEMENTS)
    others = [e for e in ELEMENTS if e[0] != name]
    kind = r.randrange(3)
    if kind == 0:
        return f"What is the chemical symbol of {name}?", symbol, [e[1] for e in r.sample(others, 3)]
    if kind == 1:
        return f"Which element has the chemical symbol {symbol}?", name, [e[0] for e in r.sample(others, 3)]
    return f"What is the atomic number of {name}?", str(number), [str(e[2]) for e in r.sample(others, 3)]


def english(r: random.Random) -> Question:
    kind = r.randrange(3)
    if kind == 0:
        word, opposite = r.choice(OPPOSITES)
        return (f"What is the opposite of \"{word}\"?", opposite,
                r.sample([o for w, o in OPPOSITES if o != opposite and w != word], 3))
    if kind == 1:
        word = r.choice(WORDS)
        return f"How many letters are in the word \"{word}\"?", str(len(word)), _numbers_near(r, len(word))
    chosen = r.sample(WORDS, 4)
    first = min(chosen)
    return "Which of these words comes first in alphabetical order?", first, [w for w in chosen if w != first]


SUBJECTS: dict[str, Callable[[random.Random], Question]] = {
    "arithmetic": arithmetic, "chemistry": chemistry, "english": english, "geography": geography, "units": units}


def item(r: random.Random, subject: str, question: Question, position: int) -> dict:
    text, right, wrong = question
    assert right not in wrong and len(set(wrong)) == 3, question
    choices = list(wrong)
    r.shuffle(choices)
    choices.insert(position, right)
    row = {"subject": subject, "question": text, **{LETTERS[i]: c for i, c in enumerate(choices)},
           "answer": LETTERS[position]}
    if text.startswith("Which of these words"):  # the question needs its words; they are the choices
        row["question"] = f"{text} {', '.join(choices)}"
    return row


def splits(sizes: dict[str, int], seed: int = 7) -> dict[str, list[dict]]:
    r = random.Random(seed)
    out: dict[str, list[dict]] = {name: [] for name in sizes}
    for subject, make in SUBJECTS.items():
        seen: set[str] = set()
        for split, size in sizes.items():
            rows = []
            for _ in range(size * 50):  # small fact pools run out: a split then holds what is left
                if len(rows) == size:
                    break
                question = make(r)
                if question[0] + question[1] in seen:
                    continue
                seen.add(question[0] + question[1])
                rows.append(item(r, subject, question, len(rows) % 4))
            out[split] += rows
    return out


def sft_row(row: dict) -> dict:
    """The prompt `gym eval` asks in the chat format (0-shot), answered with the letter."""
    heading = f"The following are multiple choice questions (with answers) about {row['subject']}."
    choices = "\n".join(f"{letter}. {row[letter]}" for letter in LETTERS)
    return {"instruction": f"{heading}\n\n{row['question']}\n{choices}\nAnswer:", "input": "",
            "output": row["answer"]}


if __name__ == "__main__":
    data = splits({"test": 60, "dev": 5, "train": 100})
    for split in ("test", "dev"):
        (HERE / f"mc_demo_{split}.json").write_text(json.dumps(data[split], ensure_ascii=False, indent=1) + "\n",
                                                     encoding="utf-8")
    train = [sft_row(row) for row in data["train"]]
    (HERE / "mc_demo_train.json").write_text(json.dumps(train, ensure_ascii=False, indent=1) + "\n",
                                             encoding="utf-8")
    print({split: len(rows) for split, rows in data.items()})
