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
import { createRequire } from 'node:module';
import { serveWhenRun } from '../runner-http.mjs';

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

serveWhenRun(import.meta.url, play); // run by drmas: listen on the port of DRMAS_RUNNER_URL, or of --port
