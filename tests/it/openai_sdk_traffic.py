"""The traffic the official `openai` Python SDK sends, against an OpenAI-compatible server.

Usage: python tests/it/openai_sdk_traffic.py BASE_URL [MODEL]
(BASE_URL without /v1, e.g. http://127.0.0.1:8000). Used by tests/it/openai_sdk.rs through
`retrace record`: `GET /v1/models`, completions and chat completions streamed and not, an unknown
model (404) and a malformed request (400), one after the other. Output lengths are fixed with
`max_tokens` and `ignore_eos`. Prints one JSON object per call on stdout:
{"call": NAME, "status": HTTP_STATUS, "completion_tokens": N or null}.
Exits non-zero if a call does not end as expected.
"""

import json
import sys

import openai

FIXED = {"ignore_eos": True}


def report(call, status, completion_tokens=None):
    print(
        json.dumps(
            {"call": call, "status": status, "completion_tokens": completion_tokens}
        ),
        flush=True,
    )


def streamed_tokens(stream, text_of):
    """Reads a stream to its end; returns (content chunks, usage.completion_tokens)."""
    chunks, usage = 0, None
    for ev in stream:
        if ev.choices and text_of(ev.choices[0]):
            chunks += 1
        if ev.usage is not None:
            usage = ev.usage.completion_tokens
    return chunks, usage


def main():
    base = sys.argv[1].rstrip("/")
    client = openai.OpenAI(
        base_url=base + "/v1",
        api_key="sk-never-recorded",
        max_retries=0,
        timeout=20.0,
    )
    models = [m.id for m in client.models.list()]
    model = sys.argv[2] if len(sys.argv) > 2 else models[0]
    report("models.list", 200)

    r = client.completions.create(
        model=model,
        prompt="The capital of France is",
        max_tokens=6,
        extra_body=FIXED,
    )
    report("completions", 200, r.usage.completion_tokens)

    s = client.completions.create(
        model=model,
        prompt=list(range(100, 140)),
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=FIXED,
    )
    chunks, usage = streamed_tokens(s, lambda c: c.text)
    assert chunks > 0, "streamed completion without text"
    report("completions.stream", 200, usage)

    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "How does a prefix cache work?"},
    ]
    r = client.chat.completions.create(
        model=model, messages=messages, max_tokens=5, extra_body=FIXED
    )
    report("chat.completions", 200, r.usage.completion_tokens)

    s = client.chat.completions.create(
        model=model,
        messages=messages + [{"role": "user", "content": "And a KV cache?"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=FIXED,
    )
    chunks, usage = streamed_tokens(s, lambda c: c.delta.content)
    assert chunks > 0, "streamed chat without content"
    report("chat.completions.stream", 200, usage)

    try:
        client.completions.create(
            model="no-such-model", prompt="hello", max_tokens=3, extra_body=FIXED
        )
        sys.exit("unknown model: expected 404")
    except openai.NotFoundError as e:
        report("unknown_model", e.status_code)

    try:
        client.completions.create(model=model, prompt="hello", max_tokens="three")
        sys.exit("max_tokens 'three': expected 400")
    except openai.BadRequestError as e:
        report("bad_request", e.status_code)


if __name__ == "__main__":
    main()
