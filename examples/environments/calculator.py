#!/usr/bin/env python3
"""A calculator tool for PPO's multi-turn rollouts (ppo.environment;
docs/algorithms.md, "Multi-turn rollouts"). Standard library only.

Each line on stdin is the prompt record as written plus "episode":
{messages, turn, final, ended}. The last message is the policy's turn:
  - an arithmetic expression such as "123+456" calls the calculator, which
    answers with a tool message holding the value (unless the turn is final);
  - a number is the answer: the episode ends with reward 1 when it equals the
    record's "response", else 0;
  - anything else ends the episode with reward 0.
Every answer depends on the line alone, so a run resumes exactly.
"""
import json
import re
import sys

EXPRESSION = re.compile(r"^\s*(\d{1,6})\s*([-+*])\s*(\d{1,6})\s*$")


def answer(line):
    episode = line["episode"]
    said = episode["messages"][-1]["content"].strip()
    call = EXPRESSION.match(said)
    if call and not episode["final"]:
        x, op, y = int(call.group(1)), call.group(2), int(call.group(3))
        value = x + y if op == "+" else x - y if op == "-" else x * y
        return {"role": "tool", "content": str(value)}
    right = said.isdigit() and said == str(line["response"]).strip()
    return {"done": True, "reward": 1.0 if right else 0.0}


for raw in sys.stdin:
    print(json.dumps(answer(json.loads(raw))), flush=True)
