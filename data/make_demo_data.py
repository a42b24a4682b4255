"""Writes Gym's demo datasets. Every row is generated here from facts and arithmetic we can check,
so the data is ours, deterministic (fixed seed) and correct.

    python data/make_demo_data.py
"""

from __future__ import annotations

import json
import random
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
                     (f"Spell the name of the capital backwards.", f"{capital} backwards is \"{capital[::-1]}\".")]
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


def write(name: str, rows: list[dict], jsonl: bool = False) -> None:
    path = HERE / name
    if jsonl:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write("alpaca_en_demo.json", alpaca_rows(400))
    write("identity.json", identity_rows())
    write("chat_en_demo.json", chat_rows(150))
    write("pt_demo.jsonl", pt_rows(), jsonl=True)
