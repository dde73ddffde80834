"""The Python systemone-client (PyPI) against our server: python3 client.py URL KEY.

Prints one JSON line with what the client parsed, for test/systemone.test.js to check."""

import json
import sys

from systemone import Choice, Client, Noul, Score, SystemOneError

url, key = sys.argv[1], sys.argv[2]
with Client(url, api_key=key) as client:
    r = client.system_one(
        state={"ticket": "I was charged twice for my subscription."},
        questions={
            "billing": Noul("Is this ticket about billing?"),
            "team": Choice("Which team?", {"billing": None, "technical": "Bugs", "sales": None}),
            "urgency": Score("How urgent is it?", ["low", "medium", "high"]),
        },
    )
    try:
        client.system_one(state="x", questions={"bad": {"type": "maybe", "instructions": "x"}})
        status = None
    except SystemOneError as e:
        status = e.status

print(json.dumps({
    "noul": r.nouls["billing"].noul,
    "choice": r.choices["team"].choice,
    "score": r.scores["urgency"].score,
    "legend": r.scores["urgency"].legend,
    "input_tokens": r.usage.input_tokens,
    "error_status": status,
}))
