"""Writes Gym's tool-calling demo datasets in LLaMA-Factory's glaive_toolcall shape (sharegpt `conversations` with
human / function_call / observation / gpt turns, and the offered functions as a JSON string in `tools`).

Four small functions whose results we compute here (a fixed weather table, exact currency rates, fixed UTC
offsets, sums), so every observation and every final answer is consistent; a few rows need no tool (a plain
answer), a few call two functions at once (the function_call turn holds a JSON list). The evaluation file uses
other phrasings and other values, so it measures calling, not recall.

    python data/make_toolcall_demo.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

TOOLS = {
    "get_weather": {"name": "get_weather", "description": "Get the current weather in a city",
                    "parameters": {"type": "object", "properties": {
                        "city": {"type": "string", "description": "The city name, e.g. Paris"}},
                        "required": ["city"]}},
    "convert_currency": {"name": "convert_currency", "description": "Convert an amount from one currency to another",
                         "parameters": {"type": "object", "properties": {
                             "amount": {"type": "number", "description": "The amount to convert"},
                             "from": {"type": "string", "description": "The currency code to convert from, e.g. USD"},
                             "to": {"type": "string", "description": "The currency code to convert to, e.g. EUR"}},
                             "required": ["amount", "from", "to"]}},
    "get_time": {"name": "get_time", "description": "Get the current local time in a time zone",
                 "parameters": {"type": "object", "properties": {
                     "timezone": {"type": "string", "description": "An IANA time zone, e.g. Europe/Paris"}},
                     "required": ["timezone"]}},
    "add": {"name": "add", "description": "Add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                           "required": ["a", "b"]}},
}

WEATHER = {"Paris": (18, "cloudy"), "Tokyo": (24, "sunny"), "Oslo": (6, "rainy"), "Cairo": (33, "sunny"),
           "Lima": (19, "foggy"), "Toronto": (11, "windy"), "Nairobi": (22, "clear"), "Madrid": (27, "sunny"),
           "Seoul": (15, "cloudy"), "Sydney": (21, "clear"), "Berlin": (9, "rainy"), "Mumbai": (31, "humid")}
RATES_PER_USD = {"USD": 1.0, "EUR": 0.9, "GBP": 0.8, "JPY": 150.0, "CHF": 0.88, "CAD": 1.35}
# The demo's clock: it is always 12:00 UTC, so local times follow from fixed offsets (no daylight saving).
OFFSETS = {"Europe/Paris": 1, "Asia/Tokyo": 9, "America/New_York": -5, "Europe/London": 0, "Asia/Kolkata": 5.5,
           "Australia/Sydney": 10, "America/Los_Angeles": -8, "Africa/Nairobi": 3}

WEATHER_ASKS = ["What's the weather like in {city}?", "Is it warm in {city} right now?",
                "How is the weather in {city}?", "Could you check the weather in {city} for me?",
                "I'm heading to {city}. What's the weather there?"]
CURRENCY_ASKS = ["Convert {amount} {src} to {dst}.", "How much is {amount} {src} in {dst}?",
                 "What do I get for {amount} {src} in {dst}?", "Please change {amount} {src} into {dst}."]
TIME_ASKS = ["What time is it in {tz}?", "Tell me the current time in {tz}.", "What's the local time in {tz}?"]
ADD_ASKS = ["What is {a} plus {b}?", "Add {a} and {b}.", "Can you sum {a} and {b} for me?"]
PLAIN = [("Hi! What can you do?", "I can check the weather, convert currencies, tell the time in a time zone and "
          "add numbers. What would you like?"),
         ("Thanks, that's all.", "You're welcome! Have a great day."),
         ("What is a time zone?", "A time zone is a region that keeps the same standard time, usually defined as an "
          "offset from UTC."),
         ("Who are you?", "I am an assistant that can call a few tools: weather, currency conversion, time and "
          "addition.")]


def _number(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else f"{x:.2f}"


def weather(rng: random.Random, cities: list[str]) -> tuple[str, dict[str, Any], str, str]:
    city = rng.choice(cities)
    temp, sky = WEATHER[city]
    return (rng.choice(WEATHER_ASKS).format(city=city), {"name": "get_weather", "arguments": {"city": city}},
            json.dumps({"city": city, "temperature_c": temp, "condition": sky}),
            f"It is {temp}°C and {sky} in {city}.")


def currency(rng: random.Random, amounts: list[int]) -> tuple[str, dict[str, Any], str, str]:
    src, dst = rng.sample(sorted(RATES_PER_USD), 2)
    amount = rng.choice(amounts)
    result = round(amount / RATES_PER_USD[src] * RATES_PER_USD[dst], 2)
    return (rng.choice(CURRENCY_ASKS).format(amount=amount, src=src, dst=dst),
            {"name": "convert_currency", "arguments": {"amount": amount, "from": src, "to": dst}},
            json.dumps({"amount": amount, "from": src, "to": dst, "result": result}),
            f"{amount} {src} is {_number(result)} {dst}.")


def clock(rng: random.Random, zones: list[str]) -> tuple[str, dict[str, Any], str, str]:
    tz = rng.choice(zones)
    minutes = int((12 + OFFSETS[tz]) * 60) % (24 * 60)
    local = f"{minutes // 60:02d}:{minutes % 60:02d}"
    return (rng.choice(TIME_ASKS).format(tz=tz), {"name": "get_time", "arguments": {"timezone": tz}},
            json.dumps({"timezone": tz, "time": local}), f"It is {local} in {tz}.")


def addition(rng: random.Random, low: int, high: int) -> tuple[str, dict[str, Any], str, str]:
    a, b = rng.randint(low, high), rng.randint(low, high)
    return (rng.choice(ADD_ASKS).format(a=a, b=b), {"name": "add", "arguments": {"a": a, "b": b}},
            json.dumps({"result": a + b}), f"{a} plus {b} is {a + b}.")


def _row(turns: list[tuple[str, str]], tools: list[str]) -> dict[str, Any]:
    return {"conversations": [{"from": who, "value": text} for who, text in turns],
            "tools": json.dumps([TOOLS[name] for name in tools])}


def rows(seed: int, n: int, cities: list[str], amounts: list[int], zones: list[str], low: int, high: int
         ) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    makers = [lambda: weather(rng, cities), lambda: currency(rng, amounts), lambda: clock(rng, zones),
              lambda: addition(rng, low, high)]
    out = []
    for i in range(n):
        offered = rng.sample(sorted(TOOLS), rng.randint(2, 4))
        if i % 10 == 7:  # no tool needed: a plain answer, even with tools on offer
            ask, answer = PLAIN[(i // 10) % len(PLAIN)]
            out.append(_row([("human", ask), ("gpt", answer)], offered))
            continue
        if i % 10 == 3:  # two calls at once, both results back in one observation turn
            first, second = weather(rng, cities), weather(rng, cities)
            while second[1] == first[1]:
                second = weather(rng, cities)
            a, b = first[1]["arguments"]["city"], second[1]["arguments"]["city"]
            out.append(_row([("human", f"What's the weather in {a} and in {b}?"),
                             ("function_call", json.dumps([first[1], second[1]])),
                             ("observation", json.dumps([json.loads(first[2]), json.loads(second[2])])),
                             ("gpt", f"{first[3]} {second[3]}")], sorted({"get_weather", *offered})))
            continue
        ask, call, observation, answer = makers[i % 4]()
        out.append(_row([("human", ask), ("function_call", json.dumps(call)), ("observation", observation),
                         ("gpt", answer)], sorted({call["name"], *offered})))
    return out


def write(name: str, data: list[dict[str, Any]]) -> None:
    (HERE / name).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    cities = sorted(WEATHER)
    zones = sorted(OFFSETS)
    write("toolcall_demo.json", rows(40, 40, cities[:8], [10, 20, 50, 100, 250], zones[:5], 1, 99))
    write("toolcall_eval_demo.json", rows(41, 12, cities[8:], [30, 75, 400], zones[5:], 100, 999))
