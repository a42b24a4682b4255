"""A scripted LLM for Training-Free GRPO tests: answers decided by the request, so runs are exact and offline."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from gym.tfgrpo import prompts
from gym.tfgrpo.llm import Completion

ROLES = {"summary": prompts.SUMMARY_SYSTEM, "advantage": prompts.ADVANTAGE_SYSTEM,
         "group_update": prompts.GROUP_UPDATE_SYSTEM, "batch_update": prompts.BATCH_UPDATE_SYSTEM,
         "judge": prompts.JUDGE_SYSTEM}


def role_of(messages: list[dict[str, str]]) -> str:
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    for role, template in ROLES.items():
        if system == template.format(k=system.split("at most ")[-1].split(" ")[0], words=32) or system == template:
            return role
    for role, template in ROLES.items():  # formatted with other numbers: compare the fixed opening
        if system[:100] == template[:100]:
            return role
    return "rollout"


def query_of(messages: list[dict[str, str]]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


def correct_for_half(messages, seed):
    """Queries 'easy ...' are always right, 'hard ...' always wrong, the rest right for even seeds."""
    query = query_of(messages)
    if query.startswith("easy"):
        return "\\boxed{1}"
    if query.startswith("hard"):
        return "\\boxed{0}"
    return "\\boxed{1}" if seed % 2 == 0 else "\\boxed{0}"


def lesson_per_task(messages):
    task = query_of(messages).split("\n")[1]
    return json.dumps([f"When solving {task}, check the last step twice."])


def add_each_lesson(messages):
    lessons = [line[2:] for line in query_of(messages).split("New lessons:\n", 1)[1].splitlines() if line.strip()]
    return json.dumps([{"operation": "ADD", "id": None, "content": lesson} for lesson in lessons])


def accept_proposals(messages):
    """The batch updater that keeps every proposal as it is."""
    text = query_of(messages)
    ops = [json.loads(line.strip()) for line in text.splitlines() if line.strip().startswith("{")]
    for line in text.splitlines():
        if line.startswith("Proposed: {"):
            ops.append(json.loads(line[len("Proposed: "):]))
    return json.dumps(ops)


class ScriptedLLM:
    """`answers[role](messages)` (rollouts: `rollout(messages, seed)`); every call is logged by role."""

    def __init__(self, rollout: Callable = correct_for_half, **answers: Callable) -> None:
        self.name = "scripted"
        self.rollout = rollout
        self.answers = {"summary": lambda m: "1. The attempt computed the answer.", "advantage": lesson_per_task,
                        "group_update": add_each_lesson, "batch_update": accept_proposals,
                        "judge": lambda m: "SCORE: 1", **answers}
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[str, list[dict[str, str]]]] = []
        self._lock = threading.Lock()

    def complete(self, messages, *, temperature, max_tokens, seed=None):
        role = role_of(messages)
        with self._lock:
            self.calls[role] += 1
            self.log.append((role, messages))
        text = self.rollout(messages, seed or 0) if role == "rollout" else self.answers[role](messages)
        return Completion(text, prompt_tokens=sum(len(m["content"].split()) for m in messages),
                          completion_tokens=len(text.split()))


@pytest.fixture()
def scripted():
    return ScriptedLLM


def rows(*queries: str) -> list[dict[str, str]]:
    return [{"question": q, "answer": "1"} for q in queries]


@pytest.fixture()
def make_rows():
    return rows


def numbers_in(text: str) -> list[str]:
    return re.findall(r"\d+", text)


class FakeOpenAI:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1 answering with `llm`; `fail_with` statuses are
    answered first, one per request (to test retries)."""

    def __init__(self, llm, fail_with: list[int] | None = None) -> None:
        import http.server

        self.llm = llm
        self.fail_with = list(fail_with or [])
        self.requests = 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake_lock:
                    fake.requests += 1
                    status = fake.fail_with.pop(0) if fake.fail_with else 200
                if status != 200:
                    payload = {"error": {"message": f"scripted {status}", "type": "x"}}
                else:
                    answer = fake.llm.complete(body["messages"], temperature=body.get("temperature", 1.0),
                                               max_tokens=body.get("max_tokens", 16), seed=body.get("seed"))
                    payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                                            "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": answer.prompt_tokens,
                                         "completion_tokens": answer.completion_tokens,
                                         "total_tokens": answer.prompt_tokens + answer.completion_tokens}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        fake_lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def fake_openai():
    servers = []

    def start(llm, fail_with=None):
        server = FakeOpenAI(llm, fail_with)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
