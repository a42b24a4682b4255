"""OpenAI's Files API on `gym api --variants STORE`, through the real openai client, and the uploads it must refuse:
a 1 GB body streamed at it (stopped at the limit, never buffered), a 10 MB line, a bad row (its line and field
named), another user's file (404). A refused upload leaves nothing behind."""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
from sqlalchemy import func, select
from tests.service.conftest import new_key

from gym.service.db import Job, StoredFile
from gym.service.limits import FileLimits
from gym.service.service import open_service

CHAT = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}]
PREFERENCE = [{"input": {"messages": [{"role": "user", "content": "Hi"}]},
               "preferred_output": [{"role": "assistant", "content": "Hello!"}],
               "non_preferred_output": [{"role": "assistant", "content": "Go away."}]}]


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_chat, serve_app):
    """A keyed store (alice, bob, an admin) served with small limits, so refusals are quick to reach."""
    store = tmp_path_factory.mktemp("files") / "store"
    keys = {who: new_key(store, "--user", who) for who in ("alice", "bob")}
    keys["admin"] = new_key(store, "--admin")
    service = open_service(store, limits=FileLimits(max_bytes=1 << 20, max_line_bytes=64 << 10, max_rows=50,
                                                    quota_bytes=3 << 20))
    url = serve_app(tiny_chat, service=service)
    clients = {who: openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
               for who, key in keys.items()}
    return url, keys, clients, service


def stored(service) -> tuple[int, list[str]]:
    """(rows in the files table, every name under the files folder): what a refused upload must leave unchanged."""
    with service.db.session() as session:
        rows = session.scalar(select(func.count()).select_from(StoredFile))
    names = sorted(p.name for p in service.files.root.iterdir()) if service.files.root.is_dir() else []
    return rows, names


def test_upload_list_get_content_delete(served):
    _, _, clients, service = served
    alice = clients["alice"]
    made = alice.files.create(file=("train.jsonl", jsonl(CHAT)), purpose="fine-tune")
    assert made.id.startswith("file-") and made.filename == "train.jsonl" and made.bytes == len(jsonl(CHAT))
    assert made.purpose == "fine-tune" and made.status == "processed"
    assert made.id in [f.id for f in alice.files.list().data]
    assert alice.files.retrieve(made.id).bytes == made.bytes
    assert alice.files.content(made.id).content == jsonl(CHAT)
    assert (service.files.root / made.id).read_bytes() == jsonl(CHAT)
    deleted = alice.files.delete(made.id)
    assert deleted.deleted and deleted.id == made.id
    assert made.id not in [f.id for f in alice.files.list().data]
    assert not (service.files.root / made.id).exists()
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(made.id)


def test_files_are_paged_with_after_and_a_stale_cursor_is_a_400(served):
    _, _, clients, _ = served
    alice = clients["alice"]
    made = [alice.files.create(file=(f"{i}.jsonl", jsonl(CHAT)), purpose="fine-tune").id for i in range(3)]
    assert [f.id for f in alice.files.list().data][:3] == made[::-1]  # newest first, within one second too
    page = alice.files.list(limit=1, after=made[2])
    assert [f.id for f in page.data] == [made[1]] and page.has_more
    alice.files.delete(made[0])
    with pytest.raises(openai.BadRequestError, match="after: .* is not in this list") as caught:
        alice.files.list(after=made[0])  # deleted since the last page: it started over from the newest, a loop
    assert caught.value.body["param"] == "after"
    for file_id in made[1:]:
        alice.files.delete(file_id)


def test_chat_rows_with_tools_or_weight_1_are_taken(served):
    _, _, clients, _ = served
    weighted = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "weight": 1}]}
    clients["alice"].files.delete(clients["alice"].files.create(file=("w.jsonl", jsonl([weighted])),
                                                                purpose="fine-tune").id)
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    made = clients["alice"].files.create(file=("tools.jsonl", jsonl([{**CHAT[1], "tools": [tool]}])),
                                         purpose="fine-tune")
    clients["alice"].files.delete(made.id)


def test_preference_rows_for_dpo_are_taken(served):
    _, _, clients, _ = served
    made = clients["alice"].files.create(file=("prefs.jsonl", jsonl(PREFERENCE)), purpose="fine-tune")
    assert made.bytes == len(jsonl(PREFERENCE))
    clients["alice"].files.delete(made.id)


def test_another_users_file_is_a_404_everywhere_and_unlisted(served):
    _, _, clients, _ = served
    mine = clients["alice"].files.create(file=("a.jsonl", jsonl(CHAT)), purpose="fine-tune")
    bob = clients["bob"]
    assert mine.id not in [f.id for f in bob.files.list().data]
    for call in (bob.files.retrieve, bob.files.content, bob.files.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            call(mine.id)
        assert caught.value.status_code == 404
    assert mine.id in [f.id for f in clients["admin"].files.list().data]  # the admin sees every file
    assert clients["alice"].files.retrieve(mine.id).id == mine.id  # still there: bob's delete did nothing
    clients["alice"].files.delete(mine.id)


@pytest.mark.parametrize("rows, message", [
    ([CHAT[0], {"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "x"}]}],
     "line 2: messages[1].role has unknown role 'bot'; expected one of 'user', 'assistant', 'tool', 'function_call' "
     "(and 'system', as the first message only)"),
    ([{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}],
     "line 1: messages[1].role is 'user' but turns must alternate; expected 'assistant' or 'function_call' here"),
    ([{"messages": [{"role": "assistant", "content": "a"}]}],
     "line 1: messages[0].role is 'assistant' but turns must alternate; expected 'user' or 'tool' here"),
    ([{"messages": [{"role": "user", "contnt": "hi"}, {"role": "assistant", "content": "x"}]}],
     "line 1: messages[0] has no 'content' key (its keys: 'role', 'contnt'). Is 'contnt' meant to be 'content'?"),
    ([{"messages": [{"role": "user", "content": 3}]}], "line 1: messages[0].content must be a string"),
    ([CHAT[1], {"messages": [{"role": "user", "content": "Hi"}]}], "line 2: messages has no assistant message"),
    ([{"prompt": "Hi", "completion": "x"}], "line 1: messages: missing"),
    ([PREFERENCE[0], {**PREFERENCE[0], "preferred_output": []}], "line 2: preferred_output must be a non-empty"),
    ([{**PREFERENCE[0], "non_preferred_output": [{"role": "user", "content": "x"}]}],
     "line 1: non_preferred_output[0].role must be 'assistant'"),
    ([CHAT[0], PREFERENCE[0]], "line 2: a preference row in a file of chat rows"),
    # OpenAI's weight 0 means "not trained on"; training ignored it and trained on the message anyway
    ([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "weight": 0}]}],
     "line 1: messages[1].weight is 0, which this server cannot honour"),
    ([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "weight": "1"}]}],
     "line 1: messages[1].weight must be 0 or 1, got '1'."),
    # training reads `tools` too: a bad list uploaded, then failed the job once a worker reached it
    ([CHAT[1], {**CHAT[1], "tools": "get_time"}], "line 2: tools is not a valid tool list: is not valid JSON"),
    ([{**CHAT[1], "tools": [{"type": "function", "function": {"parameters": {}}}]}],
     "line 1: tools is not a valid tool list: [0] has no function name"),
    ([CHAT[1]] * 51, "line 51: more than the server's limit of 50 rows"),
    ([], "no rows"),
])
def test_a_bad_row_is_a_400_naming_its_line_and_field_and_nothing_is_stored(served, rows, message):
    _, _, clients, service = served
    before = stored(service)
    with pytest.raises(openai.BadRequestError) as caught:
        clients["alice"].files.create(file=("bad.jsonl", jsonl(rows)), purpose="fine-tune")
    assert message in caught.value.body["message"]
    assert caught.value.body["param"] == "file"
    assert stored(service) == before


def test_invalid_json_and_not_utf8_name_their_line(served):
    _, _, clients, _ = served
    for body, message in ((jsonl(CHAT) + b"{nope\n", "line 3: not valid JSON"), (b"\xff\xfe\n", "line 1: not UTF-8")):
        with pytest.raises(openai.BadRequestError, match=message):
            clients["alice"].files.create(file=("bad.jsonl", body), purpose="fine-tune")


def test_nan_and_infinity_are_refused_naming_the_line_and_field(served):
    """Python's json reads NaN and Infinity (and json.dumps writes them), no other JSON parser does, OpenAI's
    included: a row holding one uploaded, and its float that is no number went on to the job."""
    _, _, clients, service = served
    before = stored(service)
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"hours": {"type": "number", "default": float("nan")}}}}}
    cases = [([CHAT[0], {**CHAT[1], "tools": [tool]}],
              "line 2: tools[0].function.parameters.properties.hours.default is NaN, which is not valid JSON"),
             ([{**CHAT[1], "score": float("inf")}], "line 1: score is Infinity"),
             ([PREFERENCE[0], {**PREFERENCE[0], "input": {**PREFERENCE[0]["input"], "t": [1, -float("inf")]}}],
              "line 2: input.t[1] is -Infinity")]
    for rows, message in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            clients["alice"].files.create(file=("nan.jsonl", jsonl(rows)), purpose="fine-tune")
        assert caught.value.status_code == 400 and message in caught.value.body["message"], caught.value.body
        assert caught.value.body["param"] == "file" and caught.value.body["type"] == "invalid_request_error"
    assert stored(service) == before


def test_a_deeply_nested_or_non_object_row_is_a_400_naming_its_line(served):
    _, _, clients, service = served
    before = stored(service)
    deep = b'{"messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}\n"  # past the JSON parser's recursion limit
    for body, message in ((jsonl(CHAT) + deep, "line 3: JSON nested too deeply"),
                          (b'[{"messages": []}]\n', "line 1: a row is a JSON object such as {\"messages\": [...]}, "
                                                    "not a list")):
        with pytest.raises(openai.BadRequestError) as caught:
            clients["alice"].files.create(file=("bad.jsonl", body), purpose="fine-tune")
        assert message in caught.value.body["message"] and caught.value.body["param"] == "file"
    assert clients["alice"].files.list().data is not None  # the connection and the server are still fine
    assert stored(service) == before


def test_a_wrong_purpose_or_no_file_is_a_400(served):
    url, keys, clients, service = served
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        clients["alice"].files.create(file=("t.jsonl", jsonl(CHAT)), purpose="batch")
    response = httpx.post(f"{url}/v1/files", data={"purpose": "fine-tune"}, files={"other": ("x", b"y")},
                          headers={"Authorization": f"Bearer {keys['alice']}"})
    assert response.status_code == 400 and "file: missing" in response.json()["error"]["message"]
    assert stored(service)[1] == []


def test_a_long_line_is_refused_as_it_arrives(served):
    """The server's line limit (64 KiB here; 4 MiB by default) stops a 10 MB line, before the size limit does."""
    _, _, clients, service = served
    before = stored(service)
    line = b'{"messages": [{"role": "user", "content": "' + b"x" * (10 << 20) + b'"}]}\n'
    with pytest.raises(openai.APIStatusError) as caught:
        clients["alice"].files.create(file=("long.jsonl", jsonl(CHAT) + line), purpose="fine-tune")
    assert caught.value.status_code in (400, 413)
    assert stored(service) == before


def test_the_default_limits_refuse_a_10_mb_line_at_4_mib(tmp_path):
    from gym.core.errors import DataError
    from gym.service.keys import Principal

    (tmp_path / "store").mkdir()
    files = open_service(tmp_path / "store").files
    upload = files.upload(Principal(user_id="alice", admin=False), "long.jsonl", "fine-tune")
    sent = 0
    with pytest.raises(DataError, match="line 2: longer than the server's limit of 4194304 bytes"):
        upload.write(b'{"messages": []}\n')
        for _ in range(10):
            upload.write(b"x" * (1 << 20))
            sent += 1 << 20
    assert sent == 4 << 20  # stopped within the chunk that passed the limit, not at the end of the line
    assert list(files.root.iterdir()) == []


def _multipart_length(total: int, boundary: str) -> int:
    return sum(len(part) for part in _multipart(total, boundary, [0]))


def _multipart(total: int, boundary: str, counter: list[int]):
    """A multipart body whose file part streams `total` bytes of one endless JSON line, counting what was sent."""
    yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n"
           f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"huge.jsonl\"\r\n"
           "Content-Type: application/octet-stream\r\n\r\n").encode()
    chunk = (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}\n' * 800)
    sent = 0
    while sent < total:
        counter[0] += len(chunk)
        sent += len(chunk)
        yield chunk
    yield f"\r\n--{boundary}--\r\n".encode()


def test_a_1_gb_streamed_upload_is_refused_at_the_size_limit_without_being_buffered(served):
    url, keys, _, service = served
    before = stored(service)
    boundary, counter = uuid.uuid4().hex, [0]
    headers = {"Authorization": f"Bearer {keys['alice']}", "Content-Type": f"multipart/form-data; boundary={boundary}"}
    try:  # chunked (no Content-Length): the server only knows the size by reading it
        response = httpx.post(f"{url}/v1/files", content=_multipart(1 << 30, boundary, counter), headers=headers,
                              timeout=60)
        assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"
    except httpx.TransportError:
        pass  # the server answered and closed the connection while the client was still sending
    assert counter[0] < 64 << 20, "the server went on reading far past its 1 MiB limit"
    assert stored(service) == before


def test_a_declared_1_gb_upload_is_refused_before_any_byte_is_read(served):
    url, keys, _, service = served
    before = stored(service)
    boundary, counter = uuid.uuid4().hex, [0]
    headers = {"Authorization": f"Bearer {keys['alice']}", "Content-Length": str(_multipart_length(1 << 30, boundary)),
               "Content-Type": f"multipart/form-data; boundary={boundary}"}
    try:
        response = httpx.post(f"{url}/v1/files", content=_multipart(1 << 30, boundary, counter), headers=headers,
                              timeout=60)
        assert response.status_code == 413
    except httpx.TransportError:
        pass
    assert counter[0] < 64 << 20
    assert stored(service) == before


def test_the_users_quota_counts_every_file_they_keep(served):
    _, _, clients, service = served
    alice = clients["alice"]
    body = jsonl([{"messages": [{"role": "user", "content": "q" * 30_000}, {"role": "assistant", "content": "a"}]}]
                 * 30)  # ~900 KB
    kept = [alice.files.create(file=(f"{i}.jsonl", body), purpose="fine-tune") for i in range(3)]
    before = stored(service)
    with pytest.raises(openai.APIStatusError) as caught:
        alice.files.create(file=("more.jsonl", body), purpose="fine-tune")
    assert caught.value.status_code == 413 and "quota" in caught.value.body["message"]
    assert stored(service) == before
    assert clients["bob"].files.create(file=("b.jsonl", body), purpose="fine-tune")  # bob's quota is his own
    alice.files.delete(kept[0].id)
    assert alice.files.create(file=("again.jsonl", body), purpose="fine-tune")  # room again once she deletes


def test_a_file_an_unfinished_job_reads_is_kept(served):
    _, _, clients, service = served
    made = clients["bob"].files.create(file=("t.jsonl", jsonl(CHAT)), purpose="fine-tune")
    with service.db.session() as session:
        session.add(Job(id=f"ftjob-{uuid.uuid4().hex[:8]}", user_id="bob", model="tiny", training_file=made.id))
    with pytest.raises(openai.ConflictError, match="cancel it first"):
        clients["bob"].files.delete(made.id)


def test_a_store_without_keys_takes_files_from_anyone(tmp_path, tiny_chat, serve_app):
    (tmp_path / "store").mkdir()
    url = serve_app(tiny_chat, service=open_service(tmp_path / "store"))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    made = client.files.create(file=("t.jsonl", jsonl(CHAT)), purpose="fine-tune")
    assert [f.id for f in client.files.list().data] == [made.id]


@pytest.mark.parametrize("body", [b"--x\r\nnot a part header\r\n\r\n", b"garbage without any boundary",
                                  b'--x\r\nContent-Disposition: form-data; name="file"; filename="t.jsonl"\r\n\r\n'
                                  + jsonl(CHAT)])
def test_a_malformed_or_truncated_multipart_body_is_a_400_and_stores_nothing(served, body):
    url, keys, _, service = served
    before = stored(service)
    response = httpx.post(f"{url}/v1/files", content=body, headers={
        "Authorization": f"Bearer {keys['alice']}", "Content-Type": "multipart/form-data; boundary=x"})
    assert response.status_code == 400, response.text
    assert stored(service) == before


def test_the_key_is_checked_before_the_body_is_read(served):
    url, _, _, service = served
    response = httpx.post(f"{url}/v1/files", files={"file": ("t.jsonl", jsonl(CHAT))}, data={"purpose": "fine-tune"},
                          headers={"Authorization": "Bearer sk-gym-wrong"})
    assert response.status_code == 401


def test_a_wrong_purpose_names_the_purpose_field(served):
    _, _, clients, service = served
    before = stored(service)
    with pytest.raises(openai.BadRequestError, match="purpose 'fine_tune'") as caught:
        clients["alice"].files.create(file=("a.jsonl", jsonl(CHAT)), purpose="fine_tune")  # type: ignore[arg-type]
    assert caught.value.body["param"] == "purpose" and stored(service) == before
