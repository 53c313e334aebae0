#!/usr/bin/env python3
"""A multi-agent team written outside drmas, trained by drmas through its gateway: Python's standard
library only (http.server, urllib, json).

The team is the toy math pair: a Solver answers "P<question>" with \\boxed{answer}, a Verifier reads
"C<question><answer>" and says <verify>approve</verify> or reject; on reject the Solver tries once
more. The reward is 1 when the final answer is the record's answer.

drmas POSTs each episode to /run:
    {"episode_id", "task", "base_url", "api_key", "agents", "seed"}
and the runner answers {"reward": number, "agent_rewards": {...}}. Every call goes to base_url, an
OpenAI-compatible endpoint of the episode, with the agent's name as the model.

Run by drmas (orchestra.runner.command), or by hand:  python3 runner.py --port 8123
"""
import argparse
import json
import os
import re
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chat(base_url, api_key, agent, prompt):
    """One call of an agent: a chat completion at the episode's endpoint; returns the answer text."""
    body = json.dumps({"model": agent, "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(base_url + "/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + api_key})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.load(resp)["choices"][0]["message"]["content"] or ""


def boxed(text):
    """The last \\boxed{...} of a text, or None."""
    m = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return m[-1].strip() if m else None


def verdict(text):
    """The last <verify>...</verify>: approve unless it says reject."""
    m = re.findall(r"<verify>(.*?)</verify>", text, re.S)
    return not (m and m[-1].strip().lower() == "reject")


def play(episode):
    """One episode of the team: Solver, Verifier, and the Solver again on a reject."""
    task = episode["task"]
    question = str(task.get("question", ""))
    golds = [str(a) for a in task.get("answers", [task.get("answer", "")])]
    base, key = episode["base_url"], episode["api_key"]
    context, answer = "", None
    for attempt in (1, 2):
        response = chat(base, key, "solver", "P" + question + context)
        answer = boxed(response)
        context += response
        if attempt == 2 or verdict(chat(base, key, "verifier", "C" + question + response)):
            break
    right = answer is not None and answer in golds
    return {"reward": 1.0 if right else 0.0}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/run":
            self.send_error(404)
            return
        episode = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        out = json.dumps(play(episode)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    # drmas sends up to runner.concurrency episodes at once: socketserver's default backlog of 5
    # drops the rest of the connections, which the client retries after 1, 3, 7... seconds.
    request_queue_size = 1024
    daemon_threads = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0, help="port (default: the one of DRMAS_RUNNER_URL)")
    args = ap.parse_args()
    port = args.port or urllib.parse.urlparse(os.environ["DRMAS_RUNNER_URL"]).port
    Server(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
