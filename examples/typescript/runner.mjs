// A multi-agent team written outside drmas with the official OpenAI Node SDK (npm `openai`), trained by
// drmas through its gateway. Plain Node (no build step); the SDK is found through NODE_PATH:
//
//   scripts/openai-node.sh        # once: installs openai into .cache/openai-node
//   bin/drmas train --config examples/typescript/team.yaml     # team.yaml sets NODE_PATH for the runner
//
// The team is the toy math pair: a Solver answers "P<question>" with \boxed{answer}, a Verifier reads
// "C<question><answer>" and says <verify>approve</verify> or reject; on reject the Solver tries once
// more. The reward is 1 when the final answer is the task's; the Verifier's role reward is whether its
// verdict matched the truth.
//
// drmas POSTs each episode to /run: {"episode_id", "task", "base_url", "api_key", "agents", "seed"}.
// Every call goes to base_url (an OpenAI-compatible endpoint of that episode alone) with the agent's
// name as the model; the runner answers {"reward": number, "agent_rewards": {...}}.
import { createRequire } from 'node:module';
import { serveWhenRun } from '../runner-http.mjs';

const require = createRequire(import.meta.url);
const { OpenAI } = require('openai'); // NODE_PATH: the folder scripts/openai-node.sh installed it in

// client is the episode's OpenAI client: its own base URL and key. options go to the SDK (a test
// passes its own fetch to see every answer).
export function client(episode, options = {}) {
  return new OpenAI({ baseURL: episode.base_url, apiKey: episode.api_key, maxRetries: 0, timeout: 300_000, ...options });
}

// The last \boxed{...} of a text, or null.
function boxed(text) {
  const all = [...text.matchAll(/\\boxed\{([^{}]*)\}/g)];
  return all.length ? all[all.length - 1][1].trim() : null;
}

// The last <verify>...</verify>: approve unless it says reject (an unreadable verdict approves).
function approves(text) {
  const all = [...text.matchAll(/<verify>([\s\S]*?)<\/verify>/g)];
  return !(all.length && all[all.length - 1][1].trim().toLowerCase() === 'reject');
}

// ask is one call of an agent: the prompt as a user message; the agent's own sampling settings are
// the gateway's (sending others is refused), so none are sent.
async function ask(openai, agent, prompt) {
  const r = await openai.chat.completions.create({ model: agent, messages: [{ role: 'user', content: prompt }] });
  return r.choices[0].message.content ?? '';
}

// play is one episode of the team: Solver, Verifier, and the Solver again on a reject.
export async function play(episode, openai = client(episode)) {
  const task = episode.task;
  const question = String(task.question ?? '');
  const golds = (task.answers ?? [task.answer]).map(String);
  let context = '', answer = null, right = false, verdictRight = null;
  for (let attempt = 1; attempt <= 2; attempt++) {
    const response = await ask(openai, 'solver', 'P' + question + context);
    answer = boxed(response);
    right = answer !== null && golds.includes(answer);
    context += response;
    if (attempt === 2) break;
    const approve = approves(await ask(openai, 'verifier', 'C' + question + response));
    verdictRight = approve === right;
    if (approve) break;
  }
  const reply = { reward: right ? 1 : 0, agent_rewards: { solver: right ? 1 : 0 } };
  if (verdictRight !== null) reply.agent_rewards.verifier = verdictRight ? 1 : 0;
  return reply;
}

serveWhenRun(import.meta.url, play); // run by drmas: listen on the port of DRMAS_RUNNER_URL, or of --port
