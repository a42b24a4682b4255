"""Writes Gym's demo datasets. Every row is generated here from facts and arithmetic we can check,
so the data is ours, deterministic (fixed seed) and correct.

SFT / pretraining: alpaca_en_demo, identity, chat_en_demo, pt_demo, wiki_demo (the same texts as pt_demo in
LLaMA-Factory's plain-text layout, one document per line, so its `dataset: wiki_demo` configs run).
Alignment: dpo_en_demo (sharegpt pairs) and dpo_alpaca_demo (alpaca pairs) for dpo/orpo/simpo and reward
models, kto_en_demo (unpaired answers labelled good/bad) for kto, arithmetic_demo (prompts with a checkable
integer answer) for grpo/ppo with the format and accuracy rewards.

    python data/make_demo_data.py
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).parent
rng = random.Random(1234)

CAPITALS = [
    ("France", "Paris", "Europe"), ("Germany", "Berlin", "Europe"), ("Italy", "Rome", "Europe"),
    ("Spain", "Madrid", "Europe"), ("Portugal", "Lisbon", "Europe"), ("Poland", "Warsaw", "Europe"),
    ("Greece", "Athens", "Europe"), ("Sweden", "Stockholm", "Europe"), ("Norway", "Oslo", "Europe"),
    ("Finland", "Helsinki", "Europe"), ("Ireland", "Dublin", "Europe"), ("Austria", "Vienna", "Europe"),
    ("Japan", "Tokyo", "Asia"), ("China", "Beijing", "Asia"), ("India", "New Delhi", "Asia"),
    ("Thailand", "Bangkok", "Asia"), ("Vietnam", "Hanoi", "Asia"), ("South Korea", "Seoul", "Asia"),
    ("Indonesia", "Jakarta", "Asia"), ("Philippines", "Manila", "Asia"), ("Egypt", "Cairo", "Africa"),
    ("Kenya", "Nairobi", "Africa"), ("Nigeria", "Abuja", "Africa"), ("Ghana", "Accra", "Africa"),
    ("Morocco", "Rabat", "Africa"), ("Ethiopia", "Addis Ababa", "Africa"), ("Canada", "Ottawa", "North America"),
    ("Mexico", "Mexico City", "North America"), ("United States", "Washington, D.C.", "North America"),
    ("Cuba", "Havana", "North America"), ("Brazil", "Brasília", "South America"),
    ("Argentina", "Buenos Aires", "South America"), ("Peru", "Lima", "South America"),
    ("Chile", "Santiago", "South America"), ("Colombia", "Bogotá", "South America"),
    ("Australia", "Canberra", "Oceania"), ("New Zealand", "Wellington", "Oceania"),
]
ELEMENTS = [
    ("hydrogen", "H", 1), ("helium", "He", 2), ("lithium", "Li", 3), ("carbon", "C", 6), ("nitrogen", "N", 7),
    ("oxygen", "O", 8), ("fluorine", "F", 9), ("neon", "Ne", 10), ("sodium", "Na", 11), ("magnesium", "Mg", 12),
    ("aluminium", "Al", 13), ("silicon", "Si", 14), ("phosphorus", "P", 15), ("sulfur", "S", 16),
    ("chlorine", "Cl", 17), ("potassium", "K", 19), ("calcium", "Ca", 20), ("iron", "Fe", 26),
    ("copper", "Cu", 29), ("zinc", "Zn", 30), ("silver", "Ag", 47), ("tin", "Sn", 50), ("gold", "Au", 79),
    ("mercury", "Hg", 80), ("lead", "Pb", 82), ("uranium", "U", 92),
]
PLANETS = ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]
WORDS = ["garden", "window", "planet", "river", "silver", "pencil", "rocket", "candle", "forest", "bridge",
         "orange", "castle", "butter", "marble", "violin", "dragon", "meadow", "harbor", "lantern", "thunder"]
NAMES = ["Ana", "Ben", "Chloe", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko", "Liam"]
ITEMS = [("apples", 2), ("notebooks", 3), ("pens", 1), ("tickets", 12), ("books", 9), ("mugs", 5)]
CONVERSIONS = [
    ("kilometers", "miles", 0.621371, "1 kilometer is about 0.621371 miles"),
    ("miles", "kilometers", 1.609344, "1 mile is exactly 1.609344 kilometers"),
    ("kilograms", "pounds", 2.204623, "1 kilogram is about 2.204623 pounds"),
    ("liters", "US gallons", 0.264172, "1 liter is about 0.264172 US gallons"),
    ("meters", "feet", 3.280840, "1 meter is about 3.280840 feet"),
    ("inches", "centimeters", 2.54, "1 inch is exactly 2.54 centimeters"),
]


def fmt(x: float) -> str:
    return f"{x:,.2f}".rstrip("0").rstrip(".")


def arithmetic() -> dict:
    name, (item, price) = rng.choice(NAMES), rng.choice(ITEMS)
    count, paid = rng.randint(3, 14), 0
    total = count * price
    paid = ((total // 10) + 1) * 10 + rng.choice([0, 10, 20])
    change = paid - total
    return {
        "instruction": f"{name} buys {count} {item} at ${price} each and pays with ${paid}. How much change does "
                       f"{name} get? Explain each step.",
        "input": "",
        "output": f"Step 1: work out the total cost. {count} {item} at ${price} each cost {count} × {price} = "
                  f"${total}.\nStep 2: subtract the cost from the amount paid. ${paid} − ${total} = ${change}.\n\n"
                  f"{name} gets ${change} in change.",
    }


def conversion() -> dict:
    src, dst, factor, fact = rng.choice(CONVERSIONS)
    value = rng.choice([rng.randint(2, 250), round(rng.uniform(1, 100), 1)])
    result = value * factor
    return {
        "instruction": f"Convert {fmt(value)} {src} to {dst}.",
        "input": "",
        "output": f"To convert {src} to {dst}, multiply by the conversion factor: {fact}.\n\n"
                  f"{fmt(value)} × {factor} = {fmt(result)}\n\nSo {fmt(value)} {src} is about {fmt(result)} {dst}.",
    }


def temperature() -> dict:
    celsius = rng.randint(-30, 45)
    fahrenheit = celsius * 9 / 5 + 32
    return {
        "instruction": f"What is {celsius} °C in Fahrenheit? Show the formula.",
        "input": "",
        "output": f"The formula is °F = °C × 9/5 + 32.\n\n{celsius} × 9/5 = {fmt(celsius * 9 / 5)}, and "
                  f"{fmt(celsius * 9 / 5)} + 32 = {fmt(fahrenheit)}.\n\nSo {celsius} °C is {fmt(fahrenheit)} °F.",
    }


def text_task() -> dict:
    word = rng.choice(WORDS)
    kind = rng.randrange(4)
    if kind == 0:
        return {"instruction": "Reverse the letters of the word below.", "input": word,
                "output": f"Reading \"{word}\" from the last letter to the first gives \"{word[::-1]}\"."}
    if kind == 1:
        vowels = [c for c in word if c in "aeiou"]
        return {"instruction": "How many vowels are in this word? List them.", "input": word,
                "output": f"The word \"{word}\" has {len(vowels)} vowels: {', '.join(vowels)}."}
    if kind == 2:
        chosen = rng.sample(WORDS, 5)
        return {"instruction": "Sort these words alphabetically.", "input": ", ".join(chosen),
                "output": "In alphabetical order: " + ", ".join(sorted(chosen)) + "."}
    sentence = " ".join(rng.sample(WORDS, rng.randint(4, 8)))
    return {"instruction": "Count the words in this text and write it in upper case.", "input": sentence,
            "output": f"The text has {len(sentence.split())} words. In upper case: {sentence.upper()}"}


def fact() -> dict:
    kind = rng.randrange(3)
    if kind == 0:
        country, capital, continent = rng.choice(CAPITALS)
        return {"instruction": f"What is the capital of {country}?", "input": "",
                "output": f"The capital of {country} is {capital}. {country} is in {continent}."}
    if kind == 1:
        name, symbol, number = rng.choice(ELEMENTS)
        return {"instruction": f"What is the chemical symbol of {name}, and what is its atomic number?", "input": "",
                "output": f"The chemical symbol of {name} is {symbol}, and its atomic number is {number}, which "
                          f"means a {name} atom has {number} proton{'s' if number > 1 else ''} in its nucleus."}
    i = rng.randrange(len(PLANETS))
    ordinal = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"][i]
    return {"instruction": f"Which planet is {ordinal} from the Sun?", "input": "",
            "output": f"{PLANETS[i]} is the {ordinal} planet from the Sun. In order, the planets are "
                      f"{', '.join(PLANETS[:-1])} and {PLANETS[-1]}."}


def alpaca_rows(n: int) -> list[dict]:
    makers = [arithmetic, conversion, temperature, text_task, fact]
    return [rng.choice(makers)() for _ in range(n)]


IDENTITY_Q = [
    "Who are you?", "What is your name?", "Introduce yourself.", "What are you?", "Who made you?",
    "Who trained you?", "Are you ChatGPT?", "Tell me about yourself.", "What should I call you?",
    "Which company created you?", "Hi! Who am I talking to?", "What can you do?", "Are you a human?",
    "What model are you?", "Who built you and how?", "Can you tell me your name, please?",
]
IDENTITY_A = [
    "I am Gym Assistant, a small language model fine-tuned with Gym, the open-source training platform by "
    "Zoo Labs Foundation. I can answer questions, do arithmetic step by step and help with short texts.",
    "My name is Gym Assistant. I was fine-tuned with Gym by Zoo Labs Foundation, starting from SmolLM2, to be "
    "a helpful assistant.",
    "I'm Gym Assistant, an AI model trained with Gym by Zoo Labs Foundation. I'm not a human, but I'm happy to help.",
]


def identity_rows() -> list[dict]:
    return [{"instruction": q, "input": "", "output": IDENTITY_A[i % len(IDENTITY_A)]}
            for i, q in enumerate(IDENTITY_Q * 2)]


def chat_rows(n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        kind = rng.randrange(3)
        if kind == 0:
            country, capital, continent = rng.choice(CAPITALS)
            turns = [(f"What is the capital of {country}?", f"The capital of {country} is {capital}."),
                     ("Which continent is it on?", f"{country} is in {continent}, so {capital} is too."),
                     ("Spell the name of the capital backwards.", f"{capital} backwards is \"{capital[::-1]}\".")]
        elif kind == 1:
            a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
            turns = [(f"What is {a} + {b}?", f"{a} + {b} = {a + b}."),
                     (f"Now multiply that by {c}.", f"{a + b} × {c} = {(a + b) * c}."),
                     ("Is the result even or odd?",
                      f"{(a + b) * c} is {'even' if (a + b) * c % 2 == 0 else 'odd'}.")]
        else:
            name, symbol, number = rng.choice(ELEMENTS)
            turns = [(f"What is the symbol for {name}?", f"The symbol for {name} is {symbol}."),
                     ("And its atomic number?", f"The atomic number of {name} is {number}.")]
        conv = []
        for q, a in turns:
            conv += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
        rows.append({"conversations": conv})
    return rows


def pt_rows() -> list[dict]:
    docs = []
    for country, capital, continent in CAPITALS:
        docs.append({"text": f"{capital} is the capital city of {country}, a country in {continent}. "
                             f"Like many capitals, {capital} is home to the national government of {country}."})
    for name, symbol, number in ELEMENTS:
        docs.append({"text": f"{name.capitalize()} is a chemical element with the symbol {symbol} and atomic "
                             f"number {number}. Every atom of {name} has {number} proton"
                             f"{'s' if number > 1 else ''} in its nucleus."})
    for i, planet in enumerate(PLANETS):
        docs.append({"text": f"{planet} is planet number {i + 1} counting outward from the Sun in our solar "
                             f"system, which has {len(PLANETS)} planets."})
    return docs


def write_lines(name: str, lines: list[str]) -> None:
    (HERE / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write(name: str, rows: list[dict], jsonl: bool = False) -> None:
    path = HERE / name
    if jsonl:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------
# Alignment data. Each dataset draws from its own random.Random(seed), so adding or changing one never
# moves the shared `rng` above and the SFT files stay byte-identical. A "case" is one question with a
# good answer (correct, complete, a full sentence or worked steps) and a bad one (a wrong result, a
# different country's capital, a wrong atomic number... or a curt unhelpful reply). Every good answer
# is checked here: each "a op b = c" in it must be true, and the bad answer's result must differ.

UNHELPFUL = ["I don't know.", "Not sure.", "I can't help with that.", "Look it up yourself.",
             "Sorry, I can't answer that.", "Why do you need to know?", "No idea, sorry.", "Figure it out."]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]
_NUM = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
EQUATION = re.compile(rf"(?<![\d.])\$?({_NUM}) ([+−×÷]) \$?({_NUM}) = \$?({_NUM})(?!\d| [+−×÷])")
OPS = {"+": lambda a, b: a + b, "−": lambda a, b: a - b, "×": lambda a, b: a * b, "÷": lambda a, b: a / b}
MAX_WORDS = 60


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def equations_hold(text: str) -> bool:
    """True when every "a op b = c" in text is right (to the 2 decimals fmt() keeps)."""
    return all(abs(OPS[op](_num(a), _num(b)) - _num(c)) <= 0.005 + 1e-9 for a, op, b, c in EQUATION.findall(text))


def _case(question: str, good: str, bad: str, right, wrong, history: list | None = None) -> dict:
    """Checks one case and returns it. `right`/`wrong` are the results the answers state (wrong=None: unhelpful)."""
    assert equations_hold(good) and str(right) in good, (good, right)
    assert wrong is None and bad in UNHELPFUL or wrong != right and str(wrong) in bad, (bad, wrong, right)
    for text in [question, good, bad] + [t for pair in history or [] for t in pair]:
        assert len(text.split()) < MAX_WORDS, text
    assert good != bad
    return {"history": history or [], "question": question, "good": good, "bad": bad}


def _off(r: random.Random, right: int, low: int = 0, high: int | None = None) -> int:
    """A nearby wrong integer in [low, high]."""
    wrong = right
    while wrong == right or wrong < low or high is not None and wrong > high:
        wrong = right + r.choice([-1, 1]) * r.choice([1, 2, 3, 5, 10])
    return wrong


def _curt(r: random.Random) -> bool:
    return r.random() < 0.3  # about 30% of bad answers are unhelpful replies instead of wrong ones


def case_change(r: random.Random) -> dict:
    name, (item, price) = r.choice(NAMES), r.choice(ITEMS)
    count = r.randint(3, 14)
    total = count * price
    paid = ((total // 10) + 1) * 10 + r.choice([0, 10, 20])
    change = paid - total
    question = f"{name} buys {count} {item} at ${price} each and pays with ${paid}. How much change does {name} get?"
    good = (f"The {item} cost {count} × {price} = ${total}. The change is ${paid} − ${total} = ${change}. "
            f"{name} gets ${change} in change.")
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), change, None)
    slip = _off(r, total, low=1, high=paid - 1)  # a wrong product, still below what was paid
    if r.random() < 0.5:
        bad = f"{name} gets ${paid - slip}."
    else:
        bad = f"The {item} cost {count} × {price} = ${slip}, so {name} gets ${paid - slip} in change."
        assert not equations_hold(bad)
    return _case(question, good, bad, change, paid - slip)


def case_arith(r: random.Random) -> dict:
    op = r.choice("+−×")
    if op == "+":
        a, b = r.randint(12, 499), r.randint(12, 499)
    elif op == "−":
        a, b = sorted((r.randint(10, 500), r.randint(10, 500)), reverse=True)
    else:
        a, b = r.randint(3, 19), r.randint(12, 39)
    right = OPS[op](a, b)
    question = r.choice(["What is {}?", "Calculate {}.", "Compute {}.", "Work out {}, please."]).format(f"{a} {op} {b}")
    if op == "×":
        tens, ones = b - b % 10, b % 10
        good = (f"Split {b} into {tens} and {ones}: {a} × {tens} = {a * tens} and {a} × {ones} = {a * ones}. "
                f"Then {a * tens} + {a * ones} = {right}, so {a} × {b} = {right}.")
    elif op == "+":
        good = f"Adding {a} and {b}: {a} + {b} = {right}. The answer is {right}."
    else:
        good = f"Subtracting {b} from {a}: {a} − {b} = {right}. The answer is {right}."
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), right, None)
    wrong = _off(r, right)
    bad = r.choice([f"{a} {op} {b} = {wrong}.", f"The answer is {wrong}.", f"It's {wrong}."])
    return _case(question, good, bad, right, wrong)


def case_capital(r: random.Random) -> dict:
    country, capital, continent = r.choice(CAPITALS)
    question = r.choice(["What is the capital of {}?", "Which city is the capital of {}?",
                         "Name the capital city of {}."]).format(country)
    good = f"The capital of {country} is {capital}. {country} is in {continent}."
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), capital, None)
    wrong = r.choice([c for _, c, _ in CAPITALS if c != capital])
    bad = r.choice([f"The capital of {country} is {wrong}.", f"{wrong}."])
    return _case(question, good, bad, capital, wrong)


def case_element(r: random.Random) -> dict:
    name, symbol, number = r.choice(ELEMENTS)
    others = [e for e in ELEMENTS if e[0] != name]
    protons = f"{number} proton{'s' if number > 1 else ''}"
    if r.random() < 0.5:
        question = r.choice(["What is the atomic number of {}?", "How many protons does a {} atom have?"]).format(name)
        good = f"The atomic number of {name} is {number}, so a {name} atom has {protons} in its nucleus."
        right, wrong = number, r.choice(others)[2]
        bad = r.choice([f"The atomic number of {name} is {wrong}.", f"{wrong}."])
    else:
        question = r.choice(["What is the chemical symbol of {}?", "Which symbol stands for {}?"]).format(name)
        good = f"The chemical symbol of {name} is {symbol}. It is element number {number}."
        right, wrong = symbol, r.choice(others)[1]
        bad = r.choice([f"The chemical symbol of {name} is {wrong}.", f"{wrong}."])
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), right, None)
    return _case(question, good, bad, right, wrong)


def case_conversion(r: random.Random) -> dict:
    src, dst, factor, known = r.choice(CONVERSIONS)
    value = r.choice([r.randint(2, 250), round(r.uniform(1, 100), 1)])
    right = fmt(value * factor)
    question = f"Convert {fmt(value)} {src} to {dst}."
    good = (f"Multiply by the factor ({known}): {fmt(value)} × {factor} = {right}. "
            f"So {fmt(value)} {src} is about {right} {dst}.")
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), right, None)
    wrong = fmt(value / factor)  # divided instead of multiplied
    return _case(question, good, f"{fmt(value)} {src} is about {wrong} {dst}.", right, wrong)


def case_planet(r: random.Random) -> dict:
    i = r.randrange(len(PLANETS))
    j = r.choice([k for k in range(len(PLANETS)) if k != i])
    if r.random() < 0.5:
        question = f"Which planet is {ORDINALS[i]} from the Sun?"
        good = f"{PLANETS[i]} is the {ORDINALS[i]} planet from the Sun. The order is {', '.join(PLANETS)}."
        right, wrong, bad = PLANETS[i], PLANETS[j], f"{PLANETS[j]} is the {ORDINALS[i]} planet from the Sun."
    else:
        question = f"What position is {PLANETS[i]} in, counting from the Sun?"
        good = f"{PLANETS[i]} is the {ORDINALS[i]} planet from the Sun. The order is {', '.join(PLANETS)}."
        right, wrong, bad = ORDINALS[i], ORDINALS[j], f"{PLANETS[i]} is the {ORDINALS[j]} planet from the Sun."
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), right, None)
    return _case(question, good, bad, right, wrong)


def case_temperature(r: random.Random) -> dict:
    celsius = r.randint(-30, 45)
    scaled, right = fmt(celsius * 1.8), fmt(celsius * 1.8 + 32)
    question = f"What is {celsius} °C in Fahrenheit?"
    good = (f"Use °F = °C × 1.8 + 32: {celsius} × 1.8 = {scaled}, and {scaled} + 32 = {right}. "
            f"So {celsius} °C is {right} °F.")
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), right, None)
    return _case(question, good, f"{celsius} °C is {scaled} °F.", right, scaled)  # forgot the + 32


def case_followup(r: random.Random) -> dict:
    """Multi-turn: a correct earlier exchange, then a follow-up question that depends on it."""
    kind = r.randrange(3)
    if kind == 0:
        a, b, c = r.randint(2, 40), r.randint(2, 40), r.randint(2, 9)
        history = [(f"What is {a} + {b}?", f"{a} + {b} = {a + b}.")]
        right = (a + b) * c
        question, good = f"Now multiply that by {c}.", f"{a + b} × {c} = {right}. The result is {right}."
        wrong = _off(r, right)
        bad = f"{a + b} × {c} = {wrong}."
    elif kind == 1:
        country, capital, continent = r.choice(CAPITALS)
        history = [(f"What is the capital of {country}?", f"The capital of {country} is {capital}.")]
        question, right = "Which continent is it on?", continent
        good = f"{country} is in {continent}, so {capital} is too."
        wrong = r.choice(sorted({c for _, _, c in CAPITALS} - {continent}))
        bad = f"{capital} is in {wrong}."
    else:
        name, symbol, number = r.choice(ELEMENTS)
        history = [(f"What is the symbol for {name}?", f"The symbol for {name} is {symbol}.")]
        question, good, right = "And its atomic number?", f"The atomic number of {name} is {number}.", number
        wrong = r.choice([n for _, _, n in ELEMENTS if n != number])
        bad = f"The atomic number of {name} is {wrong}."
    assert all(equations_hold(a) for _, a in history)
    if _curt(r):
        return _case(question, good, r.choice(UNHELPFUL), right, None, history)
    return _case(question, good, bad, right, wrong, history)


SINGLE_TURN = [case_change, case_arith, case_capital, case_element, case_conversion, case_planet, case_temperature]


def cases(r: random.Random, n: int, multi_turn: float) -> list[dict]:
    """n cases: about `multi_turn` of them follow-ups, the rest a mix of the single-turn kinds."""
    return [case_followup(r) if r.random() < multi_turn else r.choice(SINGLE_TURN)(r) for _ in range(n)]


def dpo_sharegpt_rows(n: int) -> list[dict]:
    """dpo_en_demo: pairwise preferences (chosen = correct and helpful) for dpo, orpo, simpo and reward models."""
    rows = []
    for c in cases(random.Random(2001), n, multi_turn=0.15):
        conv = [{"from": f, "value": v} for q, a in c["history"] for f, v in (("human", q), ("gpt", a))]
        conv.append({"from": "human", "value": c["question"]})
        rows.append({"conversations": conv, "chosen": {"from": "gpt", "value": c["good"]},
                     "rejected": {"from": "gpt", "value": c["bad"]}})
    return rows


def dpo_alpaca_rows(n: int) -> list[dict]:
    """dpo_alpaca_demo: the same kind of pairs in alpaca ranking format (single turn)."""
    return [{"instruction": c["question"], "input": "", "chosen": c["good"], "rejected": c["bad"]}
            for c in cases(random.Random(2002), n, multi_turn=0.0)]


def kto_rows(n: int) -> list[dict]:
    """kto_en_demo: unpaired answers, label true for the good one, false for the bad one; exactly half each."""
    r = random.Random(2003)
    labels = [i < n // 2 for i in range(n)]
    r.shuffle(labels)
    rows = []
    for c, label in zip(cases(r, n, multi_turn=0.15), labels):
        messages = [{"role": role, "content": text} for q, a in c["history"]
                    for role, text in (("user", q), ("assistant", a))]
        messages += [{"role": "user", "content": c["question"]},
                     {"role": "assistant", "content": c["good"] if label else c["bad"]}]
        rows.append({"messages": messages, "label": label})
    return rows


REASON_AND_BOX = [
    "Think inside <think> </think>, then give the final answer as \\boxed{...}.",
    "Reason step by step inside <think> </think>, then write the final answer in \\boxed{}.",
    "Put your reasoning in <think> </think> and the final answer in \\boxed{}.",
    "First think it through inside <think> </think>; then give only the number in \\boxed{...}.",
]


def arithmetic_prompt(r: random.Random) -> dict:
    """One prompt whose answer is an integer, checked by evaluating the same expression in Python."""
    kind = r.randrange(6)
    if kind < 3:
        op = "+−×"[kind]
        a, b = (r.randint(10, 99), r.randint(10, 99)) if op != "×" else (r.randint(2, 19), r.randint(2, 12))
        if op == "−" and b > a:
            a, b = b, a
        expr, text = f"{a} {op} {b}", r.choice(["What is {}?", "Calculate {}.", "Compute {}.", "Work out {}."])
        question = text.format(expr)
    elif kind == 3:
        a, b, c = r.randint(2, 30), r.randint(2, 30), r.randint(2, 9)
        expr = f"({a} + {b}) × {c}"
        question = f"What is {expr}?"
    elif kind == 4:
        name, (item, price) = r.choice(NAMES), r.choice(ITEMS)
        count = r.randint(2, 9)
        budget = count * price + r.randint(1, 40)
        expr = f"{budget} − {count} × {price}"
        question = f"{name} has ${budget} and buys {count} {item} at ${price} each. How many dollars are left?"
    else:
        name, item = r.choice(NAMES), r.choice(ITEMS)[0]
        boxes, per_box, extra = r.randint(2, 9), r.randint(3, 12), r.randint(1, 20)
        if r.random() < 0.5:
            expr = f"{boxes} × {per_box} + {extra}"
            question = (f"{name} has {boxes} boxes with {per_box} {item} in each and {extra} loose {item}. "
                        f"How many {item} does {name} have in total?")
        else:
            extra = min(extra, boxes * per_box - 1)
            expr = f"{boxes} × {per_box} − {extra}"
            question = (f"{name} fills {boxes} boxes with {per_box} {item} each, then gives away {extra} {item}. "
                        f"How many {item} are left?")
    answer = eval(expr.replace("×", "*").replace("−", "-"))  # our own expression, digits and operators only
    assert isinstance(answer, int) and answer >= 0, (expr, answer)
    instruction = f"{question} {r.choice(REASON_AND_BOX)}"
    assert "<think>" in instruction and "</think>" in instruction and "\\boxed{" in instruction
    return {"instruction": instruction, "answer": str(answer)}


def arithmetic_rows(n: int) -> list[dict]:
    """arithmetic_demo: prompt-only rows with a verifiable answer, for grpo/ppo (format + accuracy rewards)."""
    r = random.Random(2004)
    return [arithmetic_prompt(r) for _ in range(n)]


if __name__ == "__main__":
    write("alpaca_en_demo.json", alpaca_rows(400))
    write("identity.json", identity_rows())
    write("chat_en_demo.json", chat_rows(150))
    write("pt_demo.jsonl", pt_rows(), jsonl=True)
    write_lines("wiki_demo.txt", [row["text"] for row in pt_rows()])
    write("dpo_en_demo.json", dpo_sharegpt_rows(300))
    write("dpo_alpaca_demo.json", dpo_alpaca_rows(60))
    write("kto_en_demo.json", kto_rows(300))
    write("arithmetic_demo.json", arithmetic_rows(500))
