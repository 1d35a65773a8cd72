"""tests/e2e/test_openai_api.py: the OpenAI surface beyond chat with the openai client against the real models: list prompts on /v1/completions, /v1/responses (client.responses.create, streamed and not, text and a function tool), and a per-request chat_template making the base Gemma 3 270M (no template in its GGUF) chat."""

import json
import os
import unittest

import e2e_util as u
from oai_util import MODEL_ID, client, openai, start

try:
    import pydantic
except ImportError:  # it comes with the openai client, in the test venv (oai_util re-executes there)
    pydantic = None

GEMMA = u.GEMMA
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 30}},
           "required": ["city"], "additionalProperties": False}


class SmolLM2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start(cls, [{"name": "w0", "role": "both", "threads": 2, "max_seqs": 8}], 1000, "openai-api")

    def test_list_prompts(self):
        """Three prompts, n=2: six choices, indices prompt*2+i, each the same text as that prompt asked alone with
        the same seed (greedy), usage summed; streamed the same."""
        c = client(self.PORT).completions
        prompts = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]
        kw = dict(model=MODEL_ID[self.PORT], max_tokens=8, temperature=0, seed=5)
        r = c.create(prompt=prompts, n=2, **kw)
        self.assertEqual(sorted(ch.index for ch in r.choices), list(range(6)))
        alone = [c.create(prompt=p, **kw) for p in prompts]
        by_index = {ch.index: ch.text for ch in r.choices}
        for k, a in enumerate(alone):
            self.assertEqual(by_index[2 * k], a.choices[0].text, prompts[k])
            self.assertEqual(by_index[2 * k + 1], a.choices[0].text, prompts[k])  # greedy: both choices agree
        self.assertEqual(r.usage.prompt_tokens, sum(a.usage.prompt_tokens for a in alone))
        self.assertEqual(r.usage.completion_tokens, 2 * sum(a.usage.completion_tokens for a in alone))
        streamed = {}
        for ch in c.create(prompt=prompts, n=2, stream=True, **kw):
            for x in ch.choices:
                streamed[x.index] = streamed.get(x.index, "") + x.text
        self.assertEqual(streamed, by_index)

    def test_responses(self):
        rs = client(self.PORT).responses
        r = rs.create(model=MODEL_ID[self.PORT], input="What is the capital of France?", instructions="Answer briefly.",
                      max_output_tokens=40, temperature=0)
        self.assertEqual(r.object, "response")
        self.assertIn(r.status, ("completed", "incomplete"))
        self.assertTrue(r.output_text.strip(), r)
        self.assertGreater(r.usage.input_tokens, 0)
        # streamed, greedy: the deltas add up to the same text, and the last event carries the whole response
        events = list(rs.create(model=MODEL_ID[self.PORT], input="What is the capital of France?",
                                instructions="Answer briefly.", max_output_tokens=40, temperature=0, stream=True))
        self.assertEqual(events[0].type, "response.created")
        self.assertIn(events[-1].type, ("response.completed", "response.incomplete"))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, r.output_text)
        self.assertEqual(events[-1].response.output_text, text)

    def test_responses_parse(self):
        """text.format json_schema through client.responses.parse with a pydantic model: the output parses and
        validates (the grammar bounds the integer)."""
        class City(pydantic.BaseModel):
            name: str = pydantic.Field(max_length=30)
            population_millions: int = pydantic.Field(ge=0, le=40)

        for seed in range(3 if u.SCALE == 1 else 1):  # the sanitizer build looks for memory errors, not rates
            r = client(self.PORT).responses.parse(model=MODEL_ID[self.PORT], input="Describe Paris as JSON.",
                                                  text_format=City, max_output_tokens=100, temperature=1)
            self.assertEqual(r.status, "completed", r.output_text)
            self.assertIsInstance(r.output_parsed, City)
            self.assertTrue(0 <= r.output_parsed.population_millions <= 40)
        with self.assertRaises(openai.BadRequestError) as ex:  # over the context: the error names input
            client(self.PORT).responses.create(model=MODEL_ID[self.PORT], input="word " * 9000)
        self.assertEqual(ex.exception.body["param"], "input")

    def test_responses_function_tool(self):
        tools = [{"type": "function", "name": "get_weather", "description": "The current weather in a city.",
                  "parameters": WEATHER, "strict": True}]
        for stream in (False, True):
            kw = dict(model=MODEL_ID[self.PORT], input="What is the weather like in Paris today?", tools=tools,
                      tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=200,
                      # SmolLM2's own template never reads tools: the ChatML family's Hermes convention does
                      extra_body={"chat_template": "chatml"})
            if stream:
                events = list(client(self.PORT).responses.create(stream=True, **kw))
                self.assertEqual(events[-1].type, "response.completed")
                r = events[-1].response
                args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
                self.assertEqual(args, [r.output[0].arguments])
            else:
                r = client(self.PORT).responses.create(**kw)
            self.assertEqual([o.type for o in r.output], ["function_call"], r.output)
            self.assertEqual(r.output[0].name, "get_weather")
            args = json.loads(r.output[0].arguments)
            self.assertEqual(set(args), {"city"})
            self.assertTrue(1 <= len(args["city"]) <= 30)


class GemmaChatTemplate(unittest.TestCase):
    """The base Gemma 3 270M GGUF has no chat template: chat is refused, unless the request brings one."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(GEMMA):
            raise unittest.SkipTest("the model %s is missing: run scripts/setup.sh" % GEMMA)
        u.require_env(cls)
        if openai is None:
            raise unittest.SkipTest("the openai package is not installed (scripts/setup.sh makes the test venv)")
        c = u.Cluster([{"name": "w0", "role": "both", "threads": 2, "max_seqs": 4}], 1000, tag="gemma", model=GEMMA)
        cls.addClassCleanup(c.close)
        c.start()
        cls.PORT = c.port
        MODEL_ID[c.port] = client(c.port).models.list().data[0].id

    def test_chat_template(self):
        c = client(self.PORT).chat.completions
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        with self.assertRaises(openai.BadRequestError) as ex:
            c.create(model=MODEL_ID[self.PORT], messages=msgs, max_tokens=5)
        self.assertEqual(ex.exception.code, "model_not_chat")
        tpl = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' + "
               "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<start_of_turn>model\\n' }}{% endif %}")
        for template in (tpl, "gemma"):
            r = c.create(model=MODEL_ID[self.PORT], messages=msgs, max_tokens=30, temperature=0,
                         extra_body={"chat_template": template})
            self.assertTrue(r.choices[0].message.content.strip(), r)
            self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        with self.assertRaises(openai.BadRequestError) as ex:  # Jinja that does not parse
            c.create(model=MODEL_ID[self.PORT], messages=msgs, max_tokens=5,
                     extra_body={"chat_template": "{{ messages"})
        self.assertEqual(ex.exception.body["param"], "chat_template")
        r = client(self.PORT).responses.create(model=MODEL_ID[self.PORT], input=msgs[0]["content"], temperature=0,
                                               max_output_tokens=30, extra_body={"chat_template": "gemma"})
        self.assertTrue(r.output_text.strip(), r)


if __name__ == "__main__":
    unittest.main()
