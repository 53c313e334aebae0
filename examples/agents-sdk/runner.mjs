// A team written with the OpenAI Agents SDK (npm @openai/agents), trained by drmas through its gateway.
// Plain Node; the SDK is found through NODE_PATH:
//
//   scripts/openai-agents.sh      # once: installs @openai/agents (and zod, openai 7) into .cache/openai-agents
//   bin/drmas train --config examples/agents-sdk/team.yaml     # team.yaml sets NODE_PATH for the runner
//
// Two agents: a Solver with a function tool (`add`: a calculator it may call in its model's Hermes
// format, which the gateway turns into OpenAI tool_calls and the SDK runs), and a Verifier that
// approves or rejects the Solver's \boxed{} answer; on reject the Solver tries once more. The reward
// is 1 when the final answer is the task's.
//
// The Agents SDK talks to the Responses API by default; the gateway serves Chat Completions, so each
// episode gets a model provider over its own client (base_url, api_key) with useResponses: false, and
// tracing is off (nothing leaves the machine). Each agent's model is its name: the gateway samples it
// with that agent's policy.
import http from 'node:http';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const require = createRequire(import.meta.url);
const { Agent, OpenAIProvider, Runner, setTracingDisabled, tool } = require('@openai/agents');
const { OpenAI } = require('openai');
const { z } = require('zod');

setTracingDisabled(true);

// add is the Solver's tool: a + b in the toy task's arithmetic (modulo 10).
const add = tool({
  name: 'add',
  description: 'Adds two one-digit numbers modulo 10.',
  parameters: z.object({ a: z.number().int(), b: z.number().int() }),
  execute: async ({ a, b }) => String((((a + b) % 10) + 10) % 10),
});

// team builds the episode's agents and the runner that plays them on its endpoint. options go to the
// OpenAI client (a test passes its own fetch).
export function team(episode, options = {}) {
  const client = new OpenAI({ baseURL: episode.base_url, apiKey: episode.api_key, maxRetries: 0, timeout: 300_000, ...options });
  const runner = new Runner({ modelProvider: new OpenAIProvider({ openAIClient: client, useResponses: false }), tracingDisabled: true });
  const solver = new Agent({ name: 'solver', model: 'solver', tools: [add] });
  const verifier = new Agent({ name: 'verifier', model: 'verifier' });
  return { runner, solver, verifier };
}

function boxed(text) {
  const all = [...String(text ?? '').matchAll(/\\boxed\{([^{}]*)\}/g)];
  return all.length ? all[all.length - 1][1].trim() : null;
}

function approves(text) {
  const all = [...String(text ?? '').matchAll(/<verify>([\s\S]*?)<\/verify>/g)];
  return !(all.length && all[all.length - 1][1].trim().toLowerCase() === 'reject');
}

// play is one episode: the Solver (with its tool), the Verifier, the Solver again on a reject.
export async function play(episode, t = team(episode)) {
  const question = String(episode.task.question ?? '');
  const golds = (episode.task.answers ?? [episode.task.answer]).map(String);
  let context = '', right = false, verdictRight = null;
  for (let attempt = 1; attempt <= 2; attempt++) {
    const solved = await t.runner.run(t.solver, 'P' + question + context, { maxTurns: 3 });
    const response = String(solved.finalOutput ?? '');
    const answer = boxed(response);
    right = answer !== null && golds.includes(answer);
    context += response;
    if (attempt === 2) break;
    const checked = await t.runner.run(t.verifier, 'C' + question + response, { maxTurns: 1 });
    const approve = approves(checked.finalOutput);
    verdictRight = approve === right;
    if (approve) break;
  }
  const reply = { reward: right ? 1 : 0, agent_rewards: { solver: right ? 1 : 0 } };
  if (verdictRight !== null) reply.agent_rewards.verifier = verdictRight ? 1 : 0;
  return reply;
}

// serve answers POST /run with play's reply (500 with the reason when the episode could not be played).
export function serve(port, playEpisode = play) {
  const server = http.createServer((req, res) => {
    if (req.method !== 'POST' || req.url !== '/run') {
      res.writeHead(404).end();
      return;
    }
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', async () => {
      try {
        const out = JSON.stringify(await playEpisode(JSON.parse(body)));
        res.writeHead(200, { 'Content-Type': 'application/json' }).end(out);
      } catch (e) {
        res.writeHead(500, { 'Content-Type': 'text/plain' }).end(String(e?.stack ?? e));
      }
    });
  });
  server.listen(port, '127.0.0.1');
  return server;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const i = process.argv.indexOf('--port');
  serve(i > 0 ? Number(process.argv[i + 1]) : Number(new URL(process.env.DRMAS_RUNNER_URL).port));
}
