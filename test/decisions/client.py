"""OpenAI's Python client (`openai` 3.5x, PyPI) against our server: python3 client.py URL KEY MODEL.

Calls client.decisions.create with messages (a function call and its output) and all three
question types, then a request naming a call that does not exist; prints one JSON line with what
the client parsed, for test/decisions.test.js to check."""

import json
import sys

import openai

url, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
d = client.decisions.create(
    model=model,
    input=[
        {"role": "user", "content": "My order #12 never arrived."},
        {"type": "function_call", "call_id": "c1", "name": "track", "arguments": '{"order": 12}'},
        {"type": "function_call_output", "call_id": "c1", "output": "lost in transit"},
    ],
    questions=[
        {"type": "predicate", "name": "lost", "instructions": "Was the order lost?"},
        {
            "type": "choice",
            "name": "action",
            "instructions": "What should we do?",
            "choices": [{"value": "refund"}, {"value": "resend"}, {"value": True, "description": "both"}],
        },
        {"type": "score", "instructions": "How upset is the customer?", "levels": [{"label": "calm"}, {"label": "angry"}]},
    ],
)
try:
    client.decisions.create(
        model=model,
        input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}],
        questions=[{"type": "predicate", "instructions": "x"}],
    )
    status, param = None, None
except openai.BadRequestError as e:
    status, param = e.status_code, e.body.get("param") if isinstance(e.body, dict) else None

print(json.dumps({
    "types": [a.type for a in d.answers],
    "names": [a.name for a in d.answers],
    "probability": d.answers[0].probability,
    "choice": d.answers[1].choice,
    "values": [p.value for p in d.answers[1].probabilities],
    "score": d.answers[2].score,
    "labels": [p.label for p in d.answers[2].probabilities],
    "input_tokens": d.usage.input_tokens,
    "cached_tokens": d.usage.input_tokens_details.cached_tokens,
    "error_status": status,
    "error_param": param,
}))
