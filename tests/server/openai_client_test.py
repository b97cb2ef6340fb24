"""Drives `hearth serve` with the official `openai` Python client (pip install openai).

Run by native-runner/tests/serve.rs against a running server; exits non-zero on any failure.
"""

import argparse

import json

import openai
from openai import OpenAI
from pydantic import BaseModel, Field

class Engineer(BaseModel):
    name: str = Field(min_length=1, max_length=40)
    age: int = Field(ge=18, le=99)
    languages: list[str] = Field(min_length=1, max_length=3)


MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a Python function that reverses a string."},
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)

    models = [m.id for m in client.models.list()]
    assert models == [args.model], models

    # Non-streaming and streaming greedy chat give the same text.
    chat = client.chat.completions.create(model=args.model, messages=MESSAGES, max_tokens=24, temperature=0)
    text = chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant"
    assert text, "empty answer"
    assert chat.usage.completion_tokens > 0 and chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    stream = client.chat.completions.create(
        model=args.model, messages=MESSAGES, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text, ("".join(pieces), text)
    assert finish == chat.choices[0].finish_reason, (finish, chat.choices[0].finish_reason)
    assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage

    # A predicted output (OpenAI's `prediction`): the same greedy text, its drafts counted.
    predicted = client.chat.completions.create(
        model=args.model, messages=MESSAGES, max_tokens=24, temperature=0, prediction={"type": "content", "content": text}
    )
    assert predicted.choices[0].message.content == text, (predicted.choices[0].message.content, text)
    details = predicted.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens > 0, predicted.usage

    # Completions, streamed and not.
    comp = client.completions.create(model=args.model, prompt="def fibonacci(n):", max_tokens=16, temperature=0)
    comp_text = comp.choices[0].text
    assert comp_text and comp.object == "text_completion"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=args.model, prompt="def fibonacci(n):", max_tokens=16, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == comp_text, (streamed, comp_text)

    # Stop: the text ends before the first occurrence of a word from the middle of the answer.
    words = text.split()
    assert len(words) >= 6, text
    stop = words[4]
    stopped = client.chat.completions.create(model=args.model, messages=MESSAGES, max_tokens=24, temperature=0, stop=[stop])
    assert stopped.choices[0].message.content == text[: text.index(stop)], (stopped.choices[0].message.content, stop)
    assert stopped.choices[0].finish_reason == "stop"

    # Seed: the same seed gives the same sampled text.
    def sample(seed: int) -> str:
        r = client.completions.create(model=args.model, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=seed)
        return r.choices[0].text

    assert sample(42) == sample(42)

    # Structured output: the client's pydantic helper (strict json_schema) parses the answer, the
    # model's constraints (bounds, lengths) included; JSON mode gives an object; vLLM's
    # structured_outputs through extra_body.
    person = [{"role": "user", "content": "Describe a fictional software engineer: name, age, favourite languages."}]
    parsed = client.chat.completions.parse(model=args.model, messages=person, response_format=Engineer, max_tokens=120, temperature=0)
    engineer = parsed.choices[0].message.parsed
    assert isinstance(engineer, Engineer), parsed.choices[0].message.content
    grammar = parsed.usage.model_extra["grammar"]
    # One mask per token (forced tokens' rows are masked too), some tokens forced.
    assert grammar["masks"] >= parsed.usage.completion_tokens and grammar["forced_tokens"] > 0, parsed.usage
    mode = client.chat.completions.create(
        model=args.model, messages=person, response_format={"type": "json_object"}, max_tokens=120, temperature=0
    )
    assert isinstance(json.loads(mode.choices[0].message.content), dict), mode.choices[0].message.content
    chosen = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": "Is Rust memory-safe?"}],
        max_tokens=4,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert chosen.choices[0].message.content in ("yes", "no"), chosen.choices[0].message.content
    try:
        client.chat.completions.create(
            model=args.model, messages=MESSAGES, max_tokens=4, extra_body={"structured_outputs": {"regex": "(unclosed"}}
        )
        raise AssertionError("a bad regex was accepted")
    except openai.BadRequestError as error:
        assert error.body["param"] == "structured_outputs", error.body

    # Tool calls: the client reads message.tool_calls, and rebuilds them from the streamed pieces.
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    called = client.chat.completions.create(
        model=args.model, messages=ask, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=60, temperature=0
    )
    assert called.choices[0].finish_reason == "tool_calls", called
    call = called.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str), call
    pieces = {}
    for chunk in client.chat.completions.create(
        model=args.model, messages=ask, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60, temperature=0, stream=True,
    ):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = pieces.setdefault(delta.index, {"name": None, "arguments": ""})
            if delta.function.name:
                entry["name"] = delta.function.name
            entry["arguments"] += delta.function.arguments or ""
    assert [p["name"] for p in pieces.values()] == ["get_weather"], pieces
    assert pieces[0]["arguments"] == call.function.arguments, (pieces, call)
    # The call and its result go back through the template.
    answer = client.chat.completions.create(
        model=args.model,
        messages=ask + [called.choices[0].message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}],
        tools=tools, max_tokens=8, temperature=0,
    )
    assert answer.usage.prompt_tokens > called.usage.prompt_tokens, (answer.usage, called.usage)

    # Errors arrive as the client's typed exceptions.
    try:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError:
        pass
    try:
        OpenAI(base_url=args.base_url, api_key="wrong", max_retries=0).models.list()
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError:
        pass
    print("openai client: all checks passed")


if __name__ == "__main__":
    main()
