"""The openai SDK's traffic for tools/bench/bench_vllm_shadow.sh: 48 streamed chats at
temperature 0 and 16 streamed completions at temperature 0.8 with a fixed seed (deterministic
both), 4 at a time, against BASE_URL. Usage: python bench_vllm_shadow.py BASE_URL"""
import concurrent.futures as cf
import sys

from openai import OpenAI

c = OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-client-secret", timeout=60)
shared = "You are a helpful assistant. Answer briefly and plainly. " * 4


def chat(i):
    s = c.chat.completions.create(
        model="tiny-llama", stream=True, temperature=0, max_tokens=24,
        messages=[{"role": "user", "content": shared + f"Question {i}: what is {i} plus {i * 3}?"}],
        stream_options={"include_usage": True})
    return sum(1 for _ in s)


def completion(i):
    s = c.completions.create(model="tiny-llama", stream=True, temperature=0.8, seed=7,
                             max_tokens=24, prompt=shared + f"Story {i}:")
    return sum(1 for _ in s)


with cf.ThreadPoolExecutor(4) as ex:
    chunks = list(ex.map(chat, range(48))) + list(ex.map(completion, range(16)))
print(len(chunks), "requests,", sum(chunks), "chunks")
