#!/usr/bin/env python3
"""tests/router/test_openai_responses.py: /v1/responses with the official openai client against `dserve router` and
the fake worker (the harness of test_openai.py): the chat request it becomes, the response object, the streamed
events in the order the SDK expects, function tools, the refused fields, and /v1/embeddings' 400 for a model
whose width it cannot know.

Usage: test_openai_responses.py DSERVE_BINARY.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_openai as h  # noqa: E402  (the router + fake worker harness)
from test_openai import client, fake_worker, openai, prompt_ids_chat, raw, sent_to_worker  # noqa: E402

setUpModule = h.setUpModule
tearDownModule = h.tearDownModule


class ResponsesTest(unittest.TestCase):
    """/v1/responses with the openai client's responses.create: the chat request it becomes (what the worker got),
    the response object, the streamed events in the SDK's order, function tools and refusals."""

    def chat_ids(self, msgs):
        return prompt_ids_chat(msgs)

    def test_text(self):
        r = client().responses.create(model="tiny", input="Say something.", instructions="Be brief.",
                                      max_output_tokens=5, temperature=0.5, top_p=0.8)
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
        g = sent_to_worker(r.id.replace("resp_", "resp-"))
        self.assertEqual(g["prompt"], self.chat_ids(msgs))
        self.assertEqual((g["max_tokens"], g["sampling"]["temperature"], g["sampling"]["top_p"]), (5, 0.5, 0.8))
        want, finish, n = fake_worker.expected(g["prompt"], g["sampling"]["seed"], 5)
        self.assertEqual(r.object, "response")
        self.assertRegex(r.id, r"^resp_")
        self.assertEqual(r.output_text, want)
        self.assertEqual(r.output[0].type, "message")
        self.assertEqual(r.output[0].content[0].type, "output_text")
        self.assertEqual((r.status, r.incomplete_details.reason), ("incomplete", "max_output_tokens"))
        self.assertEqual((r.usage.input_tokens, r.usage.output_tokens), (len(g["prompt"]), n))
        self.assertEqual((r.instructions, r.max_output_tokens, r.temperature, r.top_p), ("Be brief.", 5, 0.5, 0.8))
        # a list of items: messages with text parts, then a call and its output (a tool turn)
        items = [{"role": "user", "content": [{"type": "input_text", "text": "Say something."}]},
                 {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi",
                                                                      "annotations": []}]},
                 {"role": "user", "content": "more"}]
        r = client().responses.create(model="tiny", input=items, max_output_tokens=3)
        self.assertEqual(sent_to_worker(r.id.replace("resp_", "resp-"))["prompt"],
                         self.chat_ids([{"role": "user", "content": "Say something."},
                                        {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "more"}]))

    def test_stream_events(self):
        events = list(client().responses.create(model="tiny", input="Say something.", max_output_tokens=4,
                                                stream=True))
        types = [e.type for e in events]
        self.assertEqual(types[:4], ["response.created", "response.in_progress", "response.output_item.added",
                                     "response.content_part.added"])
        self.assertEqual(types[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.incomplete"])
        self.assertEqual(set(types[4:-4]), {"response.output_text.delta"})
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        done = events[-1].response
        self.assertEqual(done.output_text, text)
        self.assertEqual(events[-4].text, text)
        self.assertEqual(done.usage.output_tokens, 4)
        g = sent_to_worker(done.id.replace("resp_", "resp-"))
        self.assertEqual(text, fake_worker.expected(g["prompt"], g["sampling"]["seed"], 4)[0])
        # the client's stream helper accumulates the same (it needs response.completed: an answer that ends by itself)
        with client().responses.stream(model="tiny", input="Say something.", max_output_tokens=100) as st:
            helper_text = "".join(e.delta for e in st if e.type == "response.output_text.delta")
            final = st.get_final_response()
        g = sent_to_worker(final.id.replace("resp_", "resp-"))
        self.assertEqual(final.status, "completed")
        self.assertEqual(final.output_text, helper_text)
        self.assertEqual(helper_text, fake_worker.expected(g["prompt"], g["sampling"]["seed"], 100)[0])

    def test_function_tools(self):
        tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                 {"type": "function", "name": "get_time", "description": "the time"}]
        r = client().responses.create(model="tiny", input="Say something.", tools=tools, tool_choice="required",
                                      max_output_tokens=100)
        g = sent_to_worker(r.id.replace("resp_", "resp-"))["grammar"]
        self.assertEqual((g["type"], g["parallel"]), ("tool_calls", False))
        self.assertEqual([(o.type, o.name, o.arguments) for o in r.output],
                         [("function_call", "get_weather", '{"city":"Paris"}')])
        self.assertRegex(r.output[0].call_id, r"^call_")
        self.assertEqual(r.status, "completed")
        events = list(client().responses.create(model="tiny", input="Say something.", tools=tools, stream=True,
                                                tool_choice={"type": "function", "name": "get_time"},
                                                max_output_tokens=100))
        types = [e.type for e in events]
        self.assertEqual(types[2:], ["response.output_item.added", "response.function_call_arguments.delta",
                                     "response.function_call_arguments.done", "response.output_item.done",
                                     "response.completed"])
        self.assertEqual(events[-1].response.output[0].name, "get_time")
        self.assertEqual(events[-1].response.output[0].arguments, events[4].arguments)
        self.assertEqual(events[3].delta, events[4].arguments)
        # the call and its result as input items
        call = events[-1].response.output[0]
        items = [{"role": "user", "content": "Say something."},
                 {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                 {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}]
        r = client().responses.create(model="tiny", input=items, tools=tools, max_output_tokens=3)
        self.assertEqual(r.status, "incomplete")

    def test_embeddings_need_the_width(self):
        # the tiny GGUF has no llama.embedding_length (tests/e2e/test_embeddings.py serves real embeddings)
        status, obj = raw("/v1/embeddings", b'{"input":"x"}')
        self.assertEqual((status, obj["error"]["code"], obj["error"]["param"]), (400, "model_not_embedding", "model"))
        self.assertIn("embedding_length", obj["error"]["message"])
        with self.assertRaises(openai.BadRequestError):
            client().embeddings.create(model="tiny", input="x")

    def test_refused(self):
        for kw, param, code in [
                (dict(input="x", previous_response_id="resp_1"), "previous_response_id", "unsupported_parameter"),
                (dict(input="x", reasoning={"effort": "low"}), "reasoning", "unsupported_parameter"),
                (dict(input="x", store=True), "store", "unsupported_parameter"),
                (dict(input="x", tools=[{"type": "web_search"}]), "tools[0]", "unsupported_parameter"),
                (dict(input=[{"type": "input_image", "image_url": "x"}]), "input[0]", "unsupported_parameter"),
                (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                 "input[0].content[0]", "unsupported_parameter"),
                (dict(input="x", max_output_tokens=0), "max_output_tokens", None),
                (dict(input="x", tools=[{"type": "function", "name": "bad name"}]), "tools[0].name", None),
                (dict(input="x", text={"format": {"type": "json_schema", "name": "x",
                                                  "schema": {"type": "number", "multipleOf": 0.5}}}),
                 "text.format", "unsupported_parameter"),
                (dict(), "input", None)]:
            with self.assertRaises(openai.BadRequestError) as ex:
                client().responses.create(model="tiny", **kw)
            self.assertEqual((ex.exception.body["param"], ex.exception.body["code"]), (param, code), kw)


if __name__ == "__main__":
    h.DSERVE = sys.argv.pop(1)
    unittest.main(verbosity=2)
